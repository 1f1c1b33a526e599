"""`TrajectoryGuard`: a fit whose final weights are also another row's (a W2S method's `trajectory`, docs/w2s.md)
must train the same however often it validates.

Validation draws from the process's random state (each evaluation DataLoader draws a seed for its workers when it
is iterated), so a fit that validates four times an epoch leaves that state elsewhere than one that validates once.
Training is blind to it as long as no training step draws from it and the training order is seeded on its own: the
shipped settings (dropout off, `--data.length_grouped` or a seeded sampler). Then the early-stopping fit's final
weights are, bit for bit, the fit that validates once an epoch (tests/test_shared_trajectory.py). The guard checks
both as the fit runs and records what drew; a row that reads the fit refuses one that drew (it would be a fit that
was never run). It changes nothing in training, so no stage identity holds it.
"""
from __future__ import annotations

import pickle
import random

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import RandomSampler


class TrajectoryGuard(Callback):
    """Records what made the fit's trajectory depend on its validations (`drew`: [] when nothing did): an unseeded
    shuffle of the training data, or a training step that drew from the process's random state (the first step
    that did, and which states)."""

    def __init__(self):
        self.drew: list[str] = []
        self._before: dict[str, bytes] = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if isinstance(sampler, RandomSampler) and sampler.generator is None:
            self.drew.append("the training order (an unseeded shuffle; --data.length_grouped=true seeds it)")

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if not any(d.startswith("training step") for d in self.drew):
            self._before = random_states()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if not self._before:
            return
        after = random_states()
        states = [name for name, state in after.items() if self._before.get(name) != state]
        self._before = {}
        if states:
            self.drew.append(f"training step {trainer.global_step} ({', '.join(states)} random state: dropout, noise "
                             "or sampling in the step)")


def find_trajectory_guard(trainer: Trainer):
    return next((cb for cb in trainer.callbacks if isinstance(cb, TrajectoryGuard)), None)


def random_states() -> dict[str, bytes]:
    """The process's random states that validation draws from and training could: torch's (CPU, and each CUDA
    device's once CUDA is in use), Python's, NumPy's."""
    states = {"torch": torch.get_rng_state().numpy().tobytes(), "python": pickle.dumps(random.getstate()),
              "numpy": pickle.dumps(np.random.get_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = b"".join(s.numpy().tobytes() for s in torch.cuda.get_rng_state_all())
    return states
