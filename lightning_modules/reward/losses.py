"""Pure tensor losses of the reward-model objectives (docs/w2s.md). No Lightning here: easy to test alone.

Notation: margin Δ_i = r(x_i, a_i) − r(x_i, b_i); q_i = P(a_i ≻ b_i) under the labels (1.0 for gold labels
with a = chosen).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(margin: torch.Tensor) -> torch.Tensor:
    """Gold Bradley–Terry: mean of −log σ(Δ) with a = chosen."""
    return -F.logsigmoid(margin).mean()


def soft_bradley_terry_loss(margin: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Naive W2S: −[q log σ(Δ) + (1−q) log σ(−Δ)] = BCE-with-logits(Δ, q), mean over pairs."""
    return F.binary_cross_entropy_with_logits(margin, q.to(margin.dtype))


def hardened_student_labels(margin: torch.Tensor, q: torch.Tensor, rule: str = "top") -> torch.Tensor:
    """Burns et al.'s hardening of the student's own predictions, for pairs (detached 0/1 labels, shape of Δ).

    rule "top" (SPEC, the default): the top round(mean(q)·B) pairs of the batch by σ(Δ) get 1, the rest 0 -- the
        weak labels' class balance exactly (round half to even); ties at the threshold are broken by `topk`.
    rule "quantile" (openai/weak-to-strong's `logconf_loss_fn`): threshold t = the mean(q) quantile (linear
        interpolation) of 1 − σ(Δ) over the batch; label 1 iff 1 − σ(Δ) < t, strictly. With B distinct margins
        that is ceil(mean(q)·(B−1)) positives, not round(mean(q)·B) (B = 5, mean(q) = 0.7: 3 vs 4); tied margins
        all fall on one side; a batch of one always gets 0.
    """
    margin = margin.detach()
    if rule == "quantile":
        one_minus_p = torch.sigmoid(-margin.float())
        threshold = torch.quantile(one_minus_p, q.float().mean().clamp(0.0, 1.0))
        return (one_minus_p < threshold).to(margin.dtype)
    if rule != "top":
        raise ValueError(f"hardening rule must be 'top' or 'quantile', got {rule!r}")
    batch = margin.shape[0]
    n_pos = int(torch.round(q.float().mean() * batch).item())
    hard = torch.zeros_like(margin)
    if n_pos > 0:
        hard[torch.topk(margin, k=n_pos).indices] = 1.0
    return hard


def confidence_w2s_loss(margin: torch.Tensor, q: torch.Tensor, coef: float, rule: str = "top") -> torch.Tensor:
    """Confidence-based W2S: BCE-with-logits(Δ, (1−c)·q + c·ĥ) with ĥ the detached hardened student labels."""
    target = (1.0 - coef) * q.to(margin.dtype) + coef * hardened_student_labels(margin, q, rule)
    return F.binary_cross_entropy_with_logits(margin, target)


def masked_mse(hidden: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the masked tokens *and* the hidden units of (h − h_ref)²; 0 when the mask is empty.

    hidden, reference: (N, T, H); mask: (N, T) with 1 on response tokens.
    """
    select = mask.bool()
    return selected_mse(hidden[select], reference[select])


def selected_mse(hidden: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Mean over positions and hidden units of (h − h_ref)² for pre-selected positions: hidden, reference (n, H);
    0 when n = 0. `masked_mse` and the ANCHOR term both reduce to it."""
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0  # keeps the graph (and DDP's view of used parameters)
    return ((hidden - reference.to(hidden.dtype)) ** 2).mean()


def reward_centering_loss(rewards_a: torch.Tensor, rewards_b: torch.Tensor) -> torch.Tensor:
    """Eisenstein et al.'s centering term mean((r_a + r_b)²), keeping rewards near zero mean."""
    return ((rewards_a + rewards_b) ** 2).mean()

