"""Length-bucketed scoring: run a right-padded batch as a few forwards of rows of similar length.

A batch of 2B sequences is padded to its longest row; chosen and rejected lengths are unrelated, so even a
length-grouped batch carries much padding. Sorting the rows by length and cutting them into contiguous groups,
each trimmed to its own longest row, removes most of it. Causal attention with right padding makes a row's
outputs independent of the padding after it, so the rewards are the same as one padded forward (to float
rounding). The cut is chosen by dynamic programming on a cost model: processed positions (with a quadratic
attention term) plus a fixed cost per forward.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import torch


def plan_buckets(lengths: list[int], max_buckets: int, forward_cost: float = 64.0,
                 attention_width: float = 1024.0) -> list[list[int]]:
    """Rows grouped into at most `max_buckets` forwards, longest first, minimising the modelled cost.

    Args:
        lengths: real tokens per row.
        max_buckets: most forwards to run (1 = one padded forward).
        forward_cost: fixed cost of one forward, in token positions (Python and kernel-launch overhead).
        attention_width: length at which a row's attention costs as much as its linear layers (cost per
            position is 1 + L / attention_width).
    Returns:
        lists of row indices, each group sorted by descending length.
    """
    n = len(lengths)
    order = sorted(range(n), key=lambda i: -lengths[i])
    if max_buckets <= 1 or n <= 1:
        return [order]
    L = np.asarray([lengths[i] for i in order], dtype=np.float64)  # descending
    per_row = L * (1.0 + L / attention_width)  # cost of one row padded to L (its group's first = longest)
    k_max = min(max_buckets, n)
    # best[k, j]: cost of the first j rows in k groups; a group i..j-1 costs (j - i) * per_row[i] + forward_cost.
    best = np.full((k_max + 1, n + 1), np.inf)
    arg = np.zeros((k_max + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    starts = np.arange(n)
    for k in range(1, k_max + 1):
        for j in range(1, n + 1):
            cand = best[k - 1, :j] + (j - starts[:j]) * per_row[:j] + forward_cost
            i = int(np.argmin(cand))
            best[k, j], arg[k, j] = cand[i], i
    k = int(np.argmin(best[1:, n])) + 1
    groups, j = [], n
    while k > 0:
        i = int(arg[k, j])
        groups.append(order[i:j])
        j, k = i, k - 1
    return groups[::-1]


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Every row is ones then zeros (so trimming trailing columns keeps all positions and position ids)."""
    lengths = attention_mask.sum(1, keepdim=True)  # (N, 1)
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (T,)
    return bool(torch.equal(attention_mask.bool(), positions.unsqueeze(0) < lengths))


def bucket_cuts(attention_mask: torch.Tensor, max_buckets: int,
                forward_cost: float = 64.0) -> Optional[tuple[list[tuple[torch.Tensor, int]], torch.Tensor]]:
    """The buckets of a right-padded (N, T) batch: ([(row indices, width)], inverse), where concatenating the
    buckets' rows and indexing with `inverse` puts them back in order. None when one call over the whole batch is
    the plan: one bucket, no padding to trim, or a left-padded / ragged mask (trimming would move position ids)."""
    if max_buckets <= 1 or not is_right_padded(attention_mask):
        return None
    lengths = attention_mask.sum(1).tolist()
    groups = plan_buckets(lengths, max_buckets, forward_cost)
    if len(groups) == 1 and max(lengths) == attention_mask.shape[1]:
        return None
    cuts = [(torch.as_tensor(group, device=attention_mask.device), lengths[group[0]]) for group in groups]
    order = torch.cat([idx for idx, _ in cuts])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return cuts, inverse


def bucketed_scores(score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, max_buckets: int, forward_cost: float = 64.0) -> torch.Tensor:
    """`score(ids, mask) -> (n,)` over length buckets of a right-padded (N, T) batch; rows back in order: (N,).

    Left-padded or ragged masks fall back to one forward (trimming left padding would move position ids).
    """
    plan = bucket_cuts(attention_mask, max_buckets, forward_cost)
    if plan is None:
        return score(input_ids, attention_mask)
    cuts, inverse = plan
    return torch.cat([score(input_ids[idx, :w], attention_mask[idx, :w]) for idx, w in cuts])[inverse]  # (N,)


def bucketed_positions(fn: Callable[..., tuple], inputs: torch.Tensor, attention_mask: torch.Tensor,
                       max_buckets: int, forward_cost: float = 64.0, extra: Sequence[torch.Tensor] = ()) -> tuple:
    """`fn(inputs, mask, *extra) -> tuple of per-position tensors (n, T, ...)` (None entries pass through) over
    length buckets of a right-padded batch: each bucket trimmed to its longest row, outputs re-padded with zeros to T
    and rows back in order. `inputs` is (N, T) token ids or (N, T, H) hidden states; `extra` are more (N, T, ...)
    tensors cut the same way (e.g. the positions a caller reads). The outputs at real positions are one padded
    call's (to float rounding); padding positions hold other values (zeros past a bucket's width), which no caller
    may read."""
    plan = bucket_cuts(attention_mask, max_buckets, forward_cost)
    if plan is None:
        return fn(inputs, attention_mask, *extra)
    cuts, inverse = plan
    T = attention_mask.shape[1]
    parts = [[None if t is None else _pad_positions(t, T)
              for t in fn(inputs[idx, :w], attention_mask[idx, :w], *[t[idx, :w] for t in extra])]
             for idx, w in cuts]  # per bucket: (n_g, T, ...) each
    return tuple(None if ts[0] is None else torch.cat(ts)[inverse] for ts in zip(*parts))  # (N, T, ...) each


def _pad_positions(t: torch.Tensor, length: int) -> torch.Tensor:
    """(n, T_g, ...) -> (n, length, ...), zeros after T_g."""
    pad = [0, 0] * (t.dim() - 2) + [0, length - t.shape[1]]
    return torch.nn.functional.pad(t, pad)


def processed_positions(lengths: list[int], max_buckets: int, forward_cost: float = 64.0) -> int:
    """Token positions the bucketed forwards process (for padding statistics)."""
    if max_buckets <= 1:
        return len(lengths) * max(lengths)
    return sum(len(g) * lengths[g[0]] for g in plan_buckets(lengths, max_buckets, forward_cost))
