"""BSR, batch-wise sum-to-zero regularisation (Hong et al., ICML 2025; docs/robust_baselines.md)."""
from __future__ import annotations

import torch

from lightning_modules.reward.losses import batch_sum_to_zero_loss
from lightning_modules.reward.regularisers.base import Regulariser, StepOutputs, check_coef


class BSR(Regulariser):
    """λ·B·(mean of the batch's 2B rewards)², B = pairs in the batch (`--model.bsr_coef` is its shorthand).

    Args:
        coef: λ (the paper's is 1e-3); 0 leaves the term out. Under DDP the batch is each process's own (no
            gather). Logged as `train/bsr` (B·mean², unscaled).
    """

    def __init__(self, coef: float = 1e-3):
        self.coef = check_coef(coef, "--model.bsr_coef")

    def check(self, model_args) -> None:
        from lightning_modules.export.hf_classifier import is_hf_classifier

        if is_hf_classifier(model_args["backbone"]):
            raise ValueError(f"--model.bsr_coef: --model.backbone {model_args['backbone']!r} is an outside reward "
                             "model scored whole: it only evaluates. Drop the flag")

    def keeps_reward_offset(self) -> bool:
        return True  # it penalises the rewards' level

    def term(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        bsr = batch_sum_to_zero_loss(out.rewards_a, out.rewards_b)  # this process's batch: under DDP no gather
        return self.coef * bsr, {"train/bsr": bsr}
