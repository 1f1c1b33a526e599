"""The frozen reference model, held by a callback so it never enters the LightningModule's module tree.

Kept out of the module tree means: not in `state_dict` (so not in checkpoints), not in the optimizer, not wrapped
by DDP, not toggled by `.train()` / `.eval()`. Used by ANCHOR (reference hidden states, Part A) and by the KL
term of GRPO (reference log-probs, Part B).

Protocol with the LightningModule:
- `pl_module.reference_coef` (float): 0 means "no reference needed" -> nothing is copied.
- `pl_module.reference_target()` returns the `nn.Module` to freeze (e.g. the backbone or the policy LM).
- inside `training_step`, the module calls `find_reference_callback(self.trainer)(**inputs)` (under no_grad).
"""
from __future__ import annotations

import copy
from typing import Any, Literal, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

ReferenceMode = Literal["auto", "copy", "disable_adapter"]


def is_peft_model(module: nn.Module) -> bool:
    return hasattr(module, "disable_adapter") and hasattr(module, "peft_config")


class FrozenReference:
    """The initial weights of `target`, frozen: a deep copy, or (LoRA) the live model with adapters disabled.

    Args:
        target: the module whose current weights become the reference.
        mode: "auto" (adapters disabled for a peft model, else a copy), "copy" or "disable_adapter".
    """

    def __init__(self, target: nn.Module, mode: ReferenceMode = "auto"):
        if mode not in ("auto", "copy", "disable_adapter"):
            raise ValueError(f"--reference.mode must be auto, copy or disable_adapter, got {mode!r}")
        if mode == "disable_adapter" and not is_peft_model(target):
            raise ValueError("--reference.mode disable_adapter needs a LoRA (peft) model; set --model.lora or use copy")
        if is_peft_model(target) and mode != "copy":
            # No second copy of the weights: the base with adapters disabled *is* the initial model, as long as
            # the base stays frozen (LoRA trains adapters only).
            self.mode, self.model, self._target = "disable_adapter", None, target
        else:
            self.mode, self._target = "copy", None
            self.model = copy.deepcopy(target).requires_grad_(False).eval()

    def to(self, device: Any) -> "FrozenReference":
        if self.model is not None:
            self.model.to(device)
        return self

    @torch.no_grad()  # not inference_mode: its outputs enter a loss that is backpropagated
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "copy":
            return self.model(*args, **kwargs)
        with self._target.disable_adapter():
            return self._target(*args, **kwargs)

    def parameter_count(self) -> int:
        """Parameters this reference adds to memory (0 with adapters disabled)."""
        return 0 if self.model is None else sum(p.numel() for p in self.model.parameters())


class ReferenceModelCallback(Callback):
    """Holds the frozen reference, taken at `setup` (before any checkpoint restore: the *initial* weights).

    Args:
        mode: "auto" uses the LoRA base with adapters disabled when the target is a peft model (no second copy of
            the weights) and a full frozen deep copy otherwise; "copy" always deep-copies; "disable_adapter"
            requires a peft target.
    """

    def __init__(self, mode: ReferenceMode = "auto"):
        super().__init__()
        if mode not in ("auto", "copy", "disable_adapter"):
            raise ValueError(f"--reference.mode must be auto, copy or disable_adapter, got {mode!r}")
        self.mode = mode
        self.reference: Optional[FrozenReference] = None

    @property
    def enabled(self) -> bool:
        return self.reference is not None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or self.reference is not None:
            return
        if float(getattr(pl_module, "reference_coef", 0.0)) == 0.0:
            return  # coefficient 0: no copy at all
        self.reference = FrozenReference(pl_module.reference_target(), self.mode)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.reference is not None:
            self.reference.to(pl_module.device)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self.reference = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.reference is None:
            raise RuntimeError("the reference model was not set up: reference_coef is 0 or the stage is not fit")
        return self.reference(*args, **kwargs)


def find_reference_callback(trainer: Optional[Trainer]) -> Optional[ReferenceModelCallback]:
    if trainer is None:
        return None
    for cb in trainer.callbacks:
        if isinstance(cb, ReferenceModelCallback):
            return cb
    return None
