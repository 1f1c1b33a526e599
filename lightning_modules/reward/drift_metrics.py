"""Pure tensor measures of representational drift between a student and its frozen reference (docs/drift.md).

No Lightning here. Shapes: hidden states (N, T, H), response mask (N, T) with 1 on response tokens, pooled
representations (N, D). The squared distance is `losses.masked_mse` (the ANCHOR term's own normalisation).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def pooled_response(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states over each sequence's response tokens: (N, T, H) -> (N, H); 0 for an empty mask."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # (N, T, 1)
    total = (hidden * weights).sum(dim=1)  # (N, H)
    return total / weights.sum(dim=1).clamp_min(1.0)


def masked_cosine(hidden: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the masked tokens of cos(h_t, h_ref_t) (cosine over hidden units); NaN when the mask is empty."""
    cos = F.cosine_similarity(hidden, reference.to(hidden.dtype), dim=-1, eps=1e-12)  # (N, T)
    weights = mask.to(cos.dtype)
    count = weights.sum()
    if count == 0:
        return torch.full((), float("nan"), dtype=cos.dtype, device=cos.device)
    return (cos * weights).sum() / count


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear CKA (Kornblith et al. 2019) between two representations of the same N examples.

    CKA = ||Yᶜᵀ Xᶜ||²_F / (||Xᶜᵀ Xᶜ||_F · ||Yᶜᵀ Yᶜ||_F), with Xᶜ, Yᶜ the column-centred (N, D) matrices.
    In [0, 1]; 1 for identical representations up to an orthogonal transform and an isotropic scaling.
    Computed in float64, through the (N, N) Gram matrices when N is the smaller side; NaN when either side has
    no variance.
    """
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"linear_cka needs two (N, D) matrices with the same N, "
                         f"got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] < 2:
        raise ValueError(f"linear_cka needs at least 2 examples, got {x.shape[0]}")
    x = x.double() - x.double().mean(dim=0, keepdim=True)  # (N, Dx)
    y = y.double() - y.double().mean(dim=0, keepdim=True)  # (N, Dy)
    n = x.shape[0]
    if n <= min(x.shape[1], y.shape[1]):
        k, l = x @ x.T, y @ y.T  # (N, N): <K, L>_F = ||Yᵀ X||²_F, ||K||_F = ||Xᵀ X||_F
        cross, norm_x, norm_y = (k * l).sum(), k.norm(), l.norm()
    else:
        cross = (y.T @ x).pow(2).sum()
        norm_x, norm_y = (x.T @ x).norm(), (y.T @ y).norm()
    denom = norm_x * norm_y
    if denom == 0:
        return torch.full((), float("nan"), dtype=torch.float64, device=x.device)
    return cross / denom
