"""Pure tensor pieces of the policy-gradient objectives (no Lightning): advantages, k3 KL, clipped surrogate.

Shapes: B sequences (= prompts x G samples, grouped contiguously: rows g*G .. g*G+G-1 share a prompt), T tokens.
"""
from __future__ import annotations

from typing import Optional

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages: A_i = (r_i - mean_group) / (std_group + eps), std unbiased (as DeepSeekMath/TRL).

    `scale=False` gives the mean-centred (Dr. GRPO) form. A group whose rewards are all equal gets A = 0.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)  # (P, G)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale and group_size > 1:
        std = r.std(dim=1, keepdim=True)
        centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    return centred.view(-1)


def reinforce_advantages(rewards: torch.Tensor, baseline: torch.Tensor | float) -> torch.Tensor:
    """REINFORCE with a baseline: A_i = r_i - b."""
    return rewards.float() - baseline


def update_baseline(baseline: torch.Tensor, rewards: torch.Tensor, momentum: float) -> torch.Tensor:
    """Exponential moving average of the mean reward: b <- m b + (1 - m) mean(r)."""
    return momentum * baseline + (1.0 - momentum) * rewards.float().mean()


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(x_t | x_<t) for t >= 1: (B, T-1) from logits (B, T, V) of the same sequences."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref) on samples from pi: exp(d) - d - 1 with d = ref - logp (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def masked_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's masked tokens, then over sequences that have any (GRPO's 1/|o_i| sum)."""
    mask = mask.float()
    counts = mask.sum(dim=1)  # (B,)
    per_seq = (values * mask).sum(dim=1) / counts.clamp(min=1.0)
    has = counts > 0
    if not bool(has.any()):
        return values.sum() * 0.0
    return per_seq[has].mean()


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: Optional[float] = 0.2,
) -> torch.Tensor:
    """PPO/GRPO clipped surrogate loss (to minimise): -mean min(rho A, clip(rho, 1-eps, 1+eps) A).

    rho = exp(logp - old_logp) per token; `advantages` is per sequence (B,). With one update per batch rho = 1 and
    the gradient is the plain policy gradient; `clip_eps=None` disables clipping.
    """
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages.unsqueeze(1)  # (B, 1)
    surr = ratio * adv
    if clip_eps is not None:
        surr = torch.minimum(surr, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    return -masked_sequence_mean(surr, mask)
