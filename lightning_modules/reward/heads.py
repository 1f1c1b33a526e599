"""The scalar reward head and the pooling that feeds it."""
from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Pooling = Literal["last", "mean"]


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of the last non-padding token of each row; right and left padding alike.

    attention_mask: (N, T) of 0/1 -> (N,) long.
    """
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (T,)
    return (attention_mask.long() * positions).argmax(dim=1)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """hidden (N, T, H) -> (N, H): the last non-padding token, or the mean over non-padding tokens."""
    if pooling == "last":
        idx = last_token_index(attention_mask)  # (N,)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (N, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)


class RewardHead(nn.Module):
    """Linear map from the pooled hidden state to a scalar reward, without a bias.

    Every objective here sees rewards only through pair margins r(a) − r(b), where a bias cancels: its gradient
    would be pure float noise, which Adam turns into steps of size ≈ lr (irreproducible runs). HF's
    `…ForSequenceClassification` score heads have no bias for the same reason.

    Args:
        hidden_size: width of the backbone's hidden states.
        pooling: "last" (last non-padding token, the usual reward-model head) or "mean" (encoders).
    """

    def __init__(self, hidden_size: int, pooling: Pooling = "last"):
        super().__init__()
        if pooling not in ("last", "mean"):
            raise ValueError(f"--model.pooling must be 'last' or 'mean', got {pooling!r}")
        self.pooling = pooling
        self.score = nn.Linear(hidden_size, 1, bias=False)
        nn.init.normal_(self.score.weight, std=1.0 / (hidden_size + 1) ** 0.5)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = pool(hidden, attention_mask, self.pooling)  # (N, H)
        return self.score(pooled.to(self.score.weight.dtype)).squeeze(-1)  # (N,)
