"""Every validation of a fit, and the checkpoints that selection rules other than the trainer's own need.

The trainer's `ModelCheckpoint` keeps the best checkpoint by `val/acc`: accuracy on the ID validation split's gold
labels (the `id_val` rule). The W2S protocol also reads a fit under other rules (docs/w2s.md, "Model selection"):
- `weak_val`: agreement with the *teacher* on the same validation pairs (`val/weak_acc`, logged by the reward model
  when its batches carry the teacher's margins). Early stopping under that rule needs the checkpoint where the
  agreement peaked, which `ModelCheckpoint(monitor="val/acc")` does not keep: `keep_weak_best` keeps it.
- the same-step comparison: `keep_every` keeps the checkpoint of every validation, so each can be tested.

The history (step, epoch, both accuracies, per validation) is what the budget table counts as a run's candidates.
The callback does not change training: it reads the logged metrics and saves checkpoints through the trainer (every
rank calls `save_checkpoint`; rank 0 writes it, atomically), so a stage's identity does not include it.
"""
from __future__ import annotations

import os
from typing import Optional

from lightning.pytorch import Callback, LightningModule, Trainer


class ValidationHistory(Callback):
    """Records every validation; optionally keeps the `val/weak_acc`-best checkpoint and / or every checkpoint.

    Args:
        dirpath: where the kept checkpoints go (`weak_best.ckpt`, `step<N>.ckpt`); required when one is kept.
        keep_weak_best: keep the checkpoint of the highest `val/weak_acc` (ties: the earlier one, as
            `ModelCheckpoint` keeps the earlier of equal `val/acc`).
        keep_every: keep the checkpoint of every validation.
    """

    def __init__(self, dirpath: Optional[str] = None, keep_weak_best: bool = False, keep_every: bool = False):
        if (keep_weak_best or keep_every) and not dirpath:
            raise ValueError("ValidationHistory: keep_weak_best / keep_every need a dirpath")
        self.dirpath, self.keep_weak_best, self.keep_every = dirpath, keep_weak_best, keep_every
        self.history: list[dict] = []
        self.weak_best: Optional[dict] = None  # the history entry of the kept weak_val checkpoint, with its path

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        entry = {"step": int(trainer.global_step), "epoch": int(trainer.current_epoch),
                 "val_acc": _percent(metrics.get("val/acc")), "val_weak_acc": _percent(metrics.get("val/weak_acc"))}
        if self.history and self.history[-1]["step"] == entry["step"]:
            return  # the end-of-epoch validation of a step already validated mid-epoch
        self.history.append(entry)
        if self.keep_every:
            path = os.path.join(self.dirpath, f"step{entry['step']}.ckpt")
            trainer.save_checkpoint(path)
            entry["checkpoint"] = path
        weak = entry["val_weak_acc"]
        if self.keep_weak_best and weak is not None and (self.weak_best is None or weak > self.weak_best["val_weak_acc"]):
            path = os.path.join(self.dirpath, "weak_best.ckpt")
            trainer.save_checkpoint(path)  # replaces the previous best in one step (atomic checkpoint IO)
            self.weak_best = {**entry, "checkpoint": path}

    def at_step(self, step: int) -> Optional[dict]:
        """The history entry of the validation at `step` (None if there was none)."""
        return next((e for e in self.history if e["step"] == step), None)


def _percent(value) -> Optional[float]:
    return None if value is None else round(100.0 * float(value), 2)


def find_validation_history(trainer: Trainer) -> Optional[ValidationHistory]:
    return next((cb for cb in trainer.callbacks if isinstance(cb, ValidationHistory)), None)
