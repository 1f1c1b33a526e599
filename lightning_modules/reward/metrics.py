"""Custom torchmetrics. Exact under DDP: every pair is counted once, by its index in the split.

The default DistributedSampler pads a split to a multiple of the world size by repeating samples; counting by
index and de-duplicating in `compute` keeps those repeats out of the result, so N processes give exactly the
single-process number for any split size.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat


class PairwiseAccuracy(Metric):
    """Fraction of pairs with r(chosen) > r(rejected) (a tie counts as wrong), each pair counted once."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("index", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, margin: torch.Tensor, index: torch.Tensor) -> None:
        """margin: (B,) r(chosen) − r(rejected); index: (B,) the pairs' positions in their split."""
        self.index.append(index.detach().long().flatten())
        self.correct.append((margin.detach().flatten() > 0).to(torch.float64))

    def _unique(self) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.index, list) and not self.index:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
        index, correct = dim_zero_cat(self.index), dim_zero_cat(self.correct)
        first = _first_occurrence(index)
        return index[first], correct[first]

    def compute(self) -> torch.Tensor:
        index, correct = self._unique()
        # compute() sees the states gathered from every process; keep the count of distinct pairs too, and the
        # outcome per pair (per-subset accuracy: lightning_modules.reward.subset_report).
        self.pairs_counted = int(correct.numel())
        self.pair_outcomes = (index, correct)
        if correct.numel() == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return correct.mean()


class SplitMetrics(nn.ModuleDict):
    """A ModuleDict keyed by split name, where a name may hold dots (`local:/data/prefs.jsonl`): a module name may
    not, so keys are stored with "." escaped ("%2E", and "%" as "%25") and read back unescaped."""

    @staticmethod
    def _escape(name: str) -> str:
        return name.replace("%", "%25").replace(".", "%2E")

    @staticmethod
    def _unescape(key: str) -> str:
        return key.replace("%2E", ".").replace("%25", "%")

    def __setitem__(self, name: str, module: nn.Module) -> None:
        super().__setitem__(self._escape(name), module)

    def __getitem__(self, name: str) -> nn.Module:
        return super().__getitem__(self._escape(name))

    def __contains__(self, name: str) -> bool:
        return super().__contains__(self._escape(name))

    def keys(self):
        return [self._unescape(k) for k in super().keys()]

    def items(self):
        return [(self._unescape(k), m) for k, m in super().items()]


def transfer_scores(acc_teacher: dict, acc_student: dict, id_split: str,
                    ceiling: Optional[dict] = None) -> dict:
    """WRG, AOG per target and mean, NTS and PGR from accuracies (any unit; the metric uses percent points).

    WRG = Acc_s(S) − Acc_t(S);  AOG_T = Acc_s(T) − Acc_t(T);  NTS = mean_T AOG_T − max(0, Acc_t(S) − Acc_s(S));
    PGR = (Acc_s(S) − Acc_t(S)) / (Acc_ceiling(S) − Acc_t(S)).
    """
    targets = [k for k in acc_student if k != id_split]
    aog = {t: acc_student[t] - acc_teacher[t] for t in targets}
    aog_mean = sum(aog.values()) / len(aog) if aog else float("nan")
    out = {
        "wrg": acc_student[id_split] - acc_teacher[id_split],
        "aog": aog,
        "aog_mean": aog_mean,
        "nts": aog_mean - max(0.0, acc_teacher[id_split] - acc_student[id_split]),
    }
    if ceiling is not None and id_split in ceiling:
        gap = ceiling[id_split] - acc_teacher[id_split]
        out["pgr"] = out["wrg"] / gap if gap != 0 else float("nan")
    return out


class TransferScores(Metric):
    """Teacher and student accuracy on the same pairs of every split, and the transfer scores, exact under DDP.

    `compute()` returns percent points: {"acc_student": {split: pp}, "acc_teacher": {split: pp}, "wrg", "aog":
    {target: pp}, "aog_mean", "nts"[, "pgr"]}.

    Args:
        splits: evaluation split names; `id_split` among them, the others are OOD targets.
        id_split: the in-distribution split.
        ceiling: optional ceiling accuracies in percent points per split (for PGR).
    """

    full_state_update = False

    def __init__(self, splits: list[str], id_split: str, ceiling: Optional[dict] = None, **kwargs):
        super().__init__(**kwargs)
        if id_split not in splits:
            raise ValueError(f"id split {id_split!r} is not among the splits {splits}")
        self.splits, self.id_split, self.ceiling = list(splits), id_split, ceiling
        for i, _ in enumerate(self.splits):
            self.add_state(f"index_{i}", default=[], dist_reduce_fx="cat")
            self.add_state(f"student_{i}", default=[], dist_reduce_fx="cat")
            self.add_state(f"teacher_{i}", default=[], dist_reduce_fx="cat")

    def update(self, split: str, student_margin: torch.Tensor, teacher_margin: torch.Tensor,
               index: torch.Tensor) -> None:
        i = self.splits.index(split)
        getattr(self, f"index_{i}").append(index.detach().long().flatten())
        getattr(self, f"student_{i}").append((student_margin.detach().flatten() > 0).to(torch.float64))
        getattr(self, f"teacher_{i}").append((teacher_margin.detach().flatten().to(student_margin.device) > 0).to(torch.float64))

    def _accuracies(self, i: int) -> tuple[float, float, int]:
        index = getattr(self, f"index_{i}")
        if isinstance(index, list) and not index:
            return float("nan"), float("nan"), 0
        index = dim_zero_cat(index)
        student = dim_zero_cat(getattr(self, f"student_{i}"))
        teacher = dim_zero_cat(getattr(self, f"teacher_{i}"))
        first = _first_occurrence(index)
        return (100.0 * student[first].mean().item(), 100.0 * teacher[first].mean().item(), int(first.numel()))

    def compute(self) -> dict:
        acc_s, acc_t, counts = {}, {}, {}
        for i, name in enumerate(self.splits):
            acc_s[name], acc_t[name], counts[name] = self._accuracies(i)
        out = transfer_scores(acc_t, acc_s, self.id_split, self.ceiling)
        out.update(acc_student=acc_s, acc_teacher=acc_t, pairs=counts)
        return out


def _first_occurrence(index: torch.Tensor) -> torch.Tensor:
    """Positions of the first occurrence of each distinct index (the DDP sampler's repeats dropped)."""
    order = torch.argsort(index, stable=True)
    sorted_index = index[order]
    first = torch.ones_like(sorted_index, dtype=torch.bool)
    first[1:] = sorted_index[1:] != sorted_index[:-1]
    return order[first]
