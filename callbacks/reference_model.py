"""The frozen reference model, held by a callback so it never enters the LightningModule's module tree.

Kept out of the module tree means: not in `state_dict` (so not in checkpoints), not in the optimizer, not wrapped
by DDP, not toggled by `.train()` / `.eval()`. Used by ANCHOR (reference hidden states, Part A) and by the KL
term of GRPO (reference log-probs, Part B).

Protocol with the LightningModule:
- `pl_module.reference_coef` (float): 0 means "no reference needed" -> nothing is copied.
- `pl_module.reference_target()` returns the `nn.Module` to freeze (e.g. the backbone or the policy LM).
- inside `training_step`, the module calls `callback.forward(*args, **kwargs)`; the callback is found with
  `find_reference_callback(trainer)`.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any, Literal, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn


def _is_peft_model(module: nn.Module) -> bool:
    return hasattr(module, "disable_adapter") and hasattr(module, "peft_config")


class ReferenceModelCallback(Callback):
    """Holds a frozen copy of the student/policy taken at `setup` (the initial weights).

    Args:
        mode: "auto" uses the LoRA base with adapters disabled when the target is a peft model (no second copy of
            the weights) and a full frozen deep copy otherwise; "copy" always deep-copies; "disable_adapter"
            requires a peft target.
    """

    def __init__(self, mode: Literal["auto", "copy", "disable_adapter"] = "auto"):
        super().__init__()
        self.mode = mode
        self.reference: Optional[nn.Module] = None  # the frozen copy (copy mode only)
        self._target: Optional[nn.Module] = None  # the live peft model (disable_adapter mode only)
        self.active_mode: Optional[str] = None

    @property
    def enabled(self) -> bool:
        return self.active_mode is not None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # `setup` runs before a checkpoint is restored, so the copy holds the *initial* weights on resume too.
        if stage != "fit" or self.active_mode is not None:
            return
        if float(getattr(pl_module, "reference_coef", 0.0)) == 0.0:
            return
        target = pl_module.reference_target()
        use_adapter = _is_peft_model(target) and self.mode in ("auto", "disable_adapter")
        if self.mode == "disable_adapter" and not _is_peft_model(target):
            raise ValueError("--reference.mode disable_adapter needs a LoRA (peft) model; set --model.lora or use mode copy")
        if use_adapter:
            self._target, self.active_mode = target, "disable_adapter"
            return
        self.reference = copy.deepcopy(target)
        self.reference.requires_grad_(False)
        self.reference.eval()
        self.active_mode = "copy"

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.reference is not None:
            self.reference.to(pl_module.device)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self.reference, self._target, self.active_mode = None, None, None

    @torch.no_grad()  # not inference_mode: its outputs are used in a loss that is backpropagated
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.active_mode == "copy":
            return self.reference(*args, **kwargs)
        if self.active_mode == "disable_adapter":
            # The same weights without the adapters; dropout follows the target's mode, as for the student.
            with self._target.disable_adapter():
                return self._target(*args, **kwargs)
        raise RuntimeError("the reference model was not set up: reference_coef is 0 or the stage is not fit")

    __call__ = forward


def find_reference_callback(trainer: Optional[Trainer]) -> Optional[ReferenceModelCallback]:
    if trainer is None:
        return None
    for cb in trainer.callbacks:
        if isinstance(cb, ReferenceModelCallback):
            return cb
    return None
