"""Reward centering (Eisenstein et al.; TRL's `center_rewards_coefficient`; docs/reward_model.md)."""
from __future__ import annotations

import torch

from lightning_modules.reward.losses import reward_centering_loss
from lightning_modules.reward.regularisers.base import Regulariser, StepOutputs, check_coef


class RewardCentering(Regulariser):
    """c·mean((r_a + r_b)²), keeping rewards near zero mean (`--model.center_rewards_coef` is its shorthand).

    Args:
        coef: c (TRL's ≈ 0.01); 0 leaves the term out. Logged as `train/center_loss` (unscaled).
    """

    def __init__(self, coef: float = 0.01):
        self.coef = check_coef(coef, "--model.center_rewards_coef")

    def keeps_reward_offset(self) -> bool:
        return True  # it penalises the rewards' level

    def term(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        center = reward_centering_loss(out.rewards_a, out.rewards_b)
        return self.coef * center, {"train/center_loss": center}
