"""PairwiseAccuracy counts every pair once, whatever the sampler repeated."""
import math

import torch

from lightning_modules.reward.metrics import PairwiseAccuracy


def test_accuracy_counts_ties_as_wrong():
    m = PairwiseAccuracy()
    m.update(torch.tensor([0.5, -0.1, 0.0, 2.0]), torch.tensor([0, 1, 2, 3]))
    assert m.compute().item() == 0.5 and m.pairs_counted == 4


def test_repeated_indices_are_counted_once():
    m = PairwiseAccuracy()
    m.update(torch.tensor([1.0, -1.0, 1.0]), torch.tensor([0, 1, 2]))
    m.update(torch.tensor([1.0]), torch.tensor([0]))  # what DistributedSampler's padding repeats
    assert m.compute().item() == 2 / 3
    assert m.pairs_counted == 3


def test_empty_metric_is_nan_and_reset_clears():
    m = PairwiseAccuracy()
    assert math.isnan(m.compute().item())
    m.update(torch.tensor([1.0]), torch.tensor([5]))
    m.reset()
    assert math.isnan(m.compute().item()) and m.pairs_counted == 0
