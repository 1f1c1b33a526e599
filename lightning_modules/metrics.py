"""Custom torchmetrics. Exact under DDP: every pair is counted once, by its index in the split.

The default DistributedSampler pads a split to a multiple of the world size by repeating samples; counting by
index and de-duplicating in `compute` keeps those repeats out of the result, so N processes give exactly the
single-process number for any split size.
"""
from __future__ import annotations

import torch
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
        if not self.index or (isinstance(self.index, torch.Tensor) and self.index.numel() == 0):
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
        index, correct = dim_zero_cat(self.index), dim_zero_cat(self.correct)
        order = torch.argsort(index, stable=True)
        index, correct = index[order], correct[order]
        first = torch.ones_like(index, dtype=torch.bool)
        first[1:] = index[1:] != index[:-1]
        return index[first], correct[first]

    def compute(self) -> torch.Tensor:
        _, correct = self._unique()
        if correct.numel() == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return correct.mean()

    def count(self) -> int:
        """Number of distinct pairs seen (after the DDP gather when called inside compute-time sync)."""
        return int(self._unique()[0].numel())
