"""L2-SP (Li et al. 2018): keep the fine-tuned backbone near its pretrained weights θ₀ (docs/robust_baselines.md)."""
from __future__ import annotations

import torch

from lightning_modules.reward.regularisers.base import Regulariser, StepOutputs, check_coef
from lightning_modules.reward.robust_finetuning import l2sp_penalty


class L2SP(Regulariser):
    """λ·Σ‖θ − θ₀‖² (`--model.l2sp_coef` is its shorthand): a sum (no 1/2, no mean) over every element of the
    backbone parameters that train (not the head, which has no pretrained value; not frozen layers); θ₀ = their
    values right after construction, kept outside `state_dict` and the optimizer. Not with LoRA.

    Args:
        coef: λ; 0 leaves the term out. Logged as `train/l2sp` (the distance) and `train/l2sp_term` (λ times it).
    """

    needs_pretrained_weights = True

    def __init__(self, coef: float = 0.01):
        self.coef = check_coef(coef, "--model.l2sp_coef")

    def check(self, model_args) -> None:
        from lightning_modules.reward.robust_finetuning import check_robust_options
        from lightning_modules.export.hf_classifier import is_hf_classifier

        check_robust_options(self.coef, 0, None, model_args.get("lora"), model_args.get("quantization"),
                             is_hf_classifier(model_args["backbone"]))

    def term(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        module = out.module
        distance = l2sp_penalty(module.backbone, module.pretrained_weights, module.finetuned_names)
        return self.coef * distance, {"train/l2sp": distance.detach(), "train/l2sp_term": self.coef * distance.detach()}
