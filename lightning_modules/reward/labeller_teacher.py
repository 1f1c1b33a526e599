"""A labelling function as the W2S teacher's row (docs/vader_icwsm.md, docs/w2s.md).

    python cli.py test --config <trainer> --config <data> --data.train_subset student \\
        --data.teacher_checkpoint labeller:vader_lexicon \\
        --model.class_path lightning_modules.reward.labeller_teacher.LabellerTeacherModule \\
        --model.labeller labeller:vader_lexicon --model.tokenizer <the students' tokenizer>

The data module computes the labeller's weak-label file (no model: `datamodules/preference/labeller_labels.py`) and
attaches its margin to every test pair, as it does for a trained teacher. This module has no weights: its margin on a
pair *is* that attached margin, so the teacher row is scored by the same metric (`PairwiseAccuracy`, a tie counts as
wrong), on exactly the pairs the students are scored on (same data settings, same tokenizer, same length filter).
"""
from __future__ import annotations

import os

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info

from datamodules.atomic_files import atomic_write_json
from datamodules.preference.labelling_functions import build_labeller, is_labeller
from lightning_modules.reward.metrics import PairwiseAccuracy, SplitMetrics


class LabellerTeacherModule(LightningModule):
    """The test-time scores of a labelling-function teacher, read from the data's teacher margins.

    Args:
        labeller: the labelling function, "labeller:<name>[:key=value,...]"; must equal `--data.teacher_checkpoint`.
        tokenizer: the students' tokenizer (linked to `--data.tokenizer`): the data module tokenizes with it, so its
            length filter keeps the students' pairs.
    """

    def __init__(self, labeller: str, tokenizer: str):
        super().__init__()
        if not is_labeller(labeller):
            raise ValueError(f"--model.labeller must be 'labeller:<name>', got {labeller!r}")
        build_labeller(labeller, "--model.labeller")
        self.save_hyperparameters()
        self.labeller, self.tokenizer_name = labeller, tokenizer
        self.test_metrics = SplitMetrics()
        self.test_results: dict = {}

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if dm is None:
            return
        given = getattr(dm.hparams, "teacher_checkpoint", None)
        if given != self.labeller:
            raise ValueError(f"--model.labeller {self.labeller!r} scores the margins of --data.teacher_checkpoint, "
                             f"which is {given!r}: give the same labeller to both")
        for name in dm.test_split_names:
            if name not in self.test_metrics:
                self.test_metrics[name] = PairwiseAccuracy()

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        name = self.trainer.datamodule.test_split_names[dataloader_idx]
        if "teacher_margin" not in batch:
            raise RuntimeError(f"test split {name!r} carries no teacher margins: the data module has no labels of "
                               f"{self.labeller}")
        margin = batch["teacher_margin"].to(torch.float64)  # (B,)
        self.test_metrics[name].update(margin, batch["index"])

    def on_test_epoch_end(self) -> None:
        results = {}
        for name, metric in self.test_metrics.items():
            acc = metric.compute()
            results[name] = {"acc": float(acc), "pairs": metric.pairs_counted}
            self.log(f"test/acc/{name}", acc.float(), add_dataloader_idx=False, rank_zero_only=False)
            metric.reset()
        self.test_results = results
        log_dir = self.trainer.log_dir  # a collective call under DDP: every rank asks
        if self.trainer.is_global_zero:
            rank_zero_info(f"[labeller] {self.labeller}: " + ", ".join(
                f"{n} {100 * r['acc']:.1f}% of {r['pairs']}" for n, r in results.items()))
            if log_dir:
                atomic_write_json(results, os.path.join(log_dir, "test_results.json"))

    def configure_optimizers(self):  # never trained: `cli.py test` only
        raise RuntimeError("a labelling-function teacher is not trained: run `cli.py test`, not `fit`")
