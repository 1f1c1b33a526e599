"""Small builders shared by the reward-model tests (tiny models, small synthetic data, quiet trainers)."""
from __future__ import annotations

import lightning.pytorch as pl
import torch

from datamodules.preference.datamodule import PreferenceDataModule
from lightning_modules.reward.reward_model import RewardModelModule
from lightning_modules.reward.weak_labeller import attach_weak_labeller

SOURCE = "synth_helpful_cooking"
TARGETS = ["synth_helpful_science", "synth_helpful_travel"]


def synth_options(n_train=240, n_validation=40, n_test=41, **extra):
    opts = dict(n_train=n_train, n_validation=n_validation, n_test=n_test, **extra)
    return {name: dict(opts) for name in [SOURCE, *TARGETS]}


def tiny_data(tokenizer_dir: str, cache_dir: str, **kwargs) -> PreferenceDataModule:
    # train_subset "teacher": what the data module's default was when these tests were written (now "all")
    defaults = dict(source=SOURCE, ood_targets=TARGETS, tokenizer=tokenizer_dir, source_options=synth_options(),
                    batch_size=16, eval_batch_size=16, max_length=96, cache_dir=cache_dir, seed=0,
                    train_subset="teacher")
    defaults.update(kwargs)
    dm = PreferenceDataModule(**defaults)
    attach_weak_labeller(dm)  # as cli.py does: labels with a --data.teacher_checkpoint
    return dm


def tiny_model(tokenizer_dir: str, lr: float = 3e-3, **kwargs) -> RewardModelModule:
    defaults = dict(backbone="tiny-qwen2", tokenizer=tokenizer_dir,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0))
    defaults.update(kwargs)
    return RewardModelModule(**defaults)


def quiet_trainer(root: str, **kwargs) -> pl.Trainer:
    defaults = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                    deterministic=True, default_root_dir=root)
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


def tiny_teacher_checkpoint(tmp_path_factory, tokenizer_dir: str, cache_dir: str, max_steps: int = 4) -> str:
    """A tiny reward model trained for a few steps on the teacher half (seed 3), saved as a Lightning checkpoint."""
    pl.seed_everything(3)
    teacher = tiny_model(tokenizer_dir)
    trainer = quiet_trainer(str(tmp_path_factory.mktemp("teacher")), max_steps=max_steps, limit_val_batches=0)
    trainer.fit(teacher, tiny_data(tokenizer_dir, cache_dir, train_subset="teacher"))
    path = str(tmp_path_factory.mktemp("ckpt") / "teacher.ckpt")
    trainer.save_checkpoint(path)
    return path
