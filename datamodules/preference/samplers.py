"""Length-grouped sampling for training: batches of similar lengths, so little compute goes to padding.

The order is a permutation of the dataset (a plain `Sampler` of indices, not a batch sampler), so Lightning's
DDP wrapper can shard it; rank r then takes every world-size-th index of a length-sorted chunk, which keeps
each rank's batches length-homogeneous too.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch.utils.data import Sampler


class LengthGroupedSampler(Sampler[int]):
    """Shuffle, cut into chunks of `batch_size * chunk_batches` samples, sort each chunk by length (descending),
    cut into batches and shuffle the batches. Seeded by (seed, epoch).

    Args:
        lengths: a length per sample.
        batch_size: samples per batch (times the world size under DDP, so that each rank's share is grouped).
        chunk_batches: batches per sorted chunk; larger = less padding, less batch diversity.
        seed: base seed.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, chunk_batches: int = 50, seed: int = 0):
        self.lengths = torch.as_tensor(list(lengths))
        self.batch_size, self.chunk_batches, self.seed = batch_size, chunk_batches, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        # Under DDP, Lightning's sampler wrapper does not forward set_epoch: count epochs ourselves too.
        self.epoch += 1
        perm = torch.randperm(len(self.lengths), generator=g)
        chunk = self.batch_size * self.chunk_batches
        batches = []
        for start in range(0, len(perm), chunk):
            part = perm[start:start + chunk]
            part = part[torch.argsort(self.lengths[part], descending=True, stable=True)]
            batches.extend(part[i:i + self.batch_size] for i in range(0, len(part), self.batch_size))
        order = torch.randperm(len(batches), generator=g)
        return iter(torch.cat([batches[i] for i in order]).tolist())
