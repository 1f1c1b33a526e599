"""The end of `cli.py fit` in one short block: the best and the last validation's metrics, the checkpoints, the logs.

Lightning ends a fit with "`Trainer.fit` stopped: `max_epochs=2` reached", which says neither how good the model got
nor where it is. `cli.ShiftCLI` adds this callback to every `fit`; it only reads what the trainer logged and where
its `ModelCheckpoint` wrote, so it changes nothing a run computes. Example:

    [fit] best validation (epoch 1, step 12): val/acc 0.8400, val/loss 0.4012 -- by val/acc (max)
          checkpoint runs/my_rm/version_0/checkpoints/epoch1-step12-acc0.8400.ckpt
    [fit] last validation (epoch 1, step 12): val/acc 0.8400, val/loss 0.4012
          checkpoint runs/my_rm/version_0/checkpoints/last.ckpt
    [fit] logs runs/my_rm/version_0 (tensorboard --logdir runs/my_rm/version_0)
"""
from __future__ import annotations

import math
import os
from typing import Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info


class RunSummary(Callback):
    """Records the `val/*` metrics of every validation; prints the best and the last at the end of the fit.

    Args:
        prefix: the metrics recorded (logged keys starting with it).
    """

    def __init__(self, prefix: str = "val/"):
        self.prefix = prefix
        self.history: list[dict] = []  # {"epoch", "step", "metrics": {key: float}} per validation
        self.lines: list[str] = []  # the printed block (kept for tests and for callers that log it elsewhere)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith(self.prefix) and getattr(v, "numel", lambda: 1)() == 1}
        if not metrics:
            return
        entry = {"epoch": int(trainer.current_epoch), "step": int(trainer.global_step), "metrics": metrics}
        if self.history and self.history[-1]["step"] == entry["step"]:
            self.history[-1] = entry  # an end-of-epoch validation of a step already validated: the later values
        else:
            self.history.append(entry)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        checkpoint = _first_checkpoint(trainer)
        self.lines = summary_lines(self.history, checkpoint, trainer.log_dir)
        if trainer.is_global_zero:
            rank_zero_info("\n".join(self.lines))


def summary_lines(history: list[dict], checkpoint: Optional[ModelCheckpoint], log_dir: Optional[str]) -> list[str]:
    """The block's lines: best validation (by the checkpoint callback's monitor and mode), last validation, logs."""
    lines = []
    monitor = checkpoint.monitor if checkpoint is not None else None
    best = best_entry(history, monitor, checkpoint.mode if checkpoint is not None else "max")
    best_path = checkpoint.best_model_path if checkpoint is not None else ""
    last_path = checkpoint.last_model_path if checkpoint is not None else ""
    if not history:
        lines.append("[fit] no validation ran (--trainer.limit_val_batches / check_val_every_n_epoch)")
    if best is not None:
        lines.append(f"[fit] best validation {_describe(best, monitor)} -- by {monitor} ({checkpoint.mode})")
        if best_path:
            lines.append(f"      checkpoint {_shown(best_path)}")
    if history:
        lines.append(f"[fit] last validation {_describe(history[-1], monitor)}")
    if last_path:
        lines.append(f"      checkpoint {_shown(last_path)}")
    elif best is None and best_path:
        lines.append(f"[fit] checkpoint {_shown(best_path)}")
    if checkpoint is None:
        lines.append("[fit] no checkpoint written (no ModelCheckpoint callback, or --trainer.enable_checkpointing "
                     "false)")
    if log_dir:
        lines.append(f"[fit] logs {_shown(log_dir)} (tensorboard --logdir {_shown(log_dir)})")
    return lines


def best_entry(history: list[dict], monitor: Optional[str], mode: str = "max") -> Optional[dict]:
    """The first validation with the best finite `monitor` value (ModelCheckpoint keeps the earlier of equal ones);
    None without a monitor or without a finite value."""
    if not monitor:
        return None
    scored = [e for e in history if math.isfinite(e["metrics"].get(monitor, math.nan))]
    if not scored:
        return None
    pick = max if mode == "max" else min
    return pick(scored, key=lambda e: e["metrics"][monitor])  # max/min return the first of equal keys


def _describe(entry: dict, monitor: Optional[str]) -> str:
    keys = sorted(entry["metrics"], key=lambda k: (k != monitor, k))  # the monitored metric first
    values = ", ".join(f"{k} {entry['metrics'][k]:.4f}" for k in keys)
    return f"(epoch {entry['epoch']}, step {entry['step']}): {values}"


def _first_checkpoint(trainer: Trainer) -> Optional[ModelCheckpoint]:
    return next((cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)), None)


def _shown(path: str) -> str:
    """`path` relative to the working directory when it lies under it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def find_run_summary(trainer: Trainer) -> Optional[RunSummary]:
    return next((cb for cb in trainer.callbacks if isinstance(cb, RunSummary)), None)
