"""`MixtureMetrics`: per-distribution accuracy, refusal rate, malformed rate, persona fractions (read three ways: the
exact identity tag; the tag read tolerantly, or the behaviour where no tag is readable, `rewards.read_persona`; and
whose rule the completion follows, `rewards.behavioural_persona`), the share of identity tags that
name no persona of the family, and (non-refusal variants) the rate of the shifted answer.

Exact under DDP: each evaluated sample is stored as one row (sample index, distribution, outcome, persona); the
rows of all ranks are gathered (in rank order) and de-duplicated by sample index, keeping the first occurrence.
The default DistributedSampler's padding repeats samples; they are counted once, so N processes give exactly the
single-process counts.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

NO_PERSONA = -1  # no identity tag
OTHER_IDENTITY = -2  # a tag naming no persona of the family ("I am 2028 ."); counted in "none" and on its own


def _cat_rows(rows, width: int, dtype, device) -> torch.Tensor:
    """A list state before sync, a tensor after it (torchmetrics concatenates on gather)."""
    if isinstance(rows, list) and not rows:
        return torch.zeros((0, width), dtype=dtype, device=device)
    return dim_zero_cat(rows)


class MixtureMetrics(Metric):
    """Counts per distribution x persona; `compute()` returns count tensors, `summarize` the rates.

    Args:
        num_distributions: number of distributions (rows are indexed by `dist_idx`).
        num_personas: number of personas (persona index -1 = no tag, -2 = a tag naming no persona; both are the
            "none" column, and -2 is also counted as `other_identity`). The read and behavioural indices are -1
            where they name no persona (malformed, or personas that behave alike and an unreadable tag).
        track_shifted: also count answers equal to the cyclic-shift answer (`val/shifted/<d>`: in the non-refusal
            variants, how often the wrong persona's answer was given).
    """

    full_state_update = False

    def __init__(self, num_distributions: int, num_personas: int, track_shifted: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.num_distributions = num_distributions
        self.num_personas = num_personas
        self.track_shifted = track_shifted
        # rows: (sample_idx, dist_idx, correct, refused, malformed, persona_idx, shifted, behaviour_idx, read_idx)
        self.add_state("rows", default=[], dist_reduce_fx="cat")

    def update(self, sample_idx: torch.Tensor, dist_idx: torch.Tensor, correct: torch.Tensor, refused: torch.Tensor,
               malformed: torch.Tensor, persona_idx: torch.Tensor, shifted: torch.Tensor | None = None,
               behaviour_idx: torch.Tensor | None = None, read_idx: torch.Tensor | None = None) -> None:
        cols = [sample_idx, dist_idx, correct, refused, malformed, persona_idx,
                torch.zeros_like(correct) if shifted is None else shifted,
                torch.full_like(persona_idx, NO_PERSONA) if behaviour_idx is None else behaviour_idx,
                torch.full_like(persona_idx, NO_PERSONA) if read_idx is None else read_idx]
        self.rows.append(torch.stack([c.to(self.device, torch.long).view(-1) for c in cols], dim=1))

    def _rows(self, width: int, dtype) -> torch.Tensor:
        return _cat_rows(self.rows, width, dtype, self.device)

    def compute(self) -> dict[str, torch.Tensor]:
        D, P = self.num_distributions, self.num_personas
        rows = self._rows(9, torch.long)
        if rows.numel():
            # keep the first occurrence of each sample index (stable sort keeps gather order among duplicates)
            order = torch.sort(rows[:, 0], stable=True).indices
            rows = rows[order]
            first = torch.ones(len(rows), dtype=torch.bool, device=rows.device)
            first[1:] = rows[1:, 0] != rows[:-1, 0]
            rows = rows[first]
        d, persona, behaviour, read = rows[:, 1], rows[:, 5].clone(), rows[:, 7].clone(), rows[:, 8].clone()
        for column in (persona, behaviour, read):
            column[column < 0] = P  # last column = none/unknown
        n = torch.bincount(d, minlength=D).float()
        out = {
            "n": n,
            "correct": torch.bincount(d, weights=rows[:, 2].float(), minlength=D),
            "refused": torch.bincount(d, weights=rows[:, 3].float(), minlength=D),
            "malformed": torch.bincount(d, weights=rows[:, 4].float(), minlength=D),
            "other_identity": torch.bincount(d, weights=(rows[:, 5] == OTHER_IDENTITY).float(), minlength=D),
            "persona_counts": torch.bincount(d * (P + 1) + persona, minlength=D * (P + 1)).float().view(D, P + 1),
            "persona_behaviour_counts": torch.bincount(d * (P + 1) + behaviour, minlength=D * (P + 1)).float().view(D, P + 1),
            "persona_read_counts": torch.bincount(d * (P + 1) + read, minlength=D * (P + 1)).float().view(D, P + 1),
            "persona_correct": torch.bincount(
                d * (P + 1) + persona, weights=rows[:, 2].float(), minlength=D * (P + 1)
            ).view(D, P + 1),
            "persona_refused": torch.bincount(
                d * (P + 1) + persona, weights=rows[:, 3].float(), minlength=D * (P + 1)
            ).view(D, P + 1),
        }
        if self.track_shifted:
            out["shifted"] = torch.bincount(d, weights=rows[:, 6].float(), minlength=D)
        return out


def per_distribution(counts: dict[str, torch.Tensor], num_distributions: int) -> dict[str, torch.Tensor]:
    """`MixtureMetrics.compute()` with one row per distribution again: torchmetrics squeezes one-element results to
    0-dim tensors, so with a single distribution `n` would not be indexable."""
    return {k: v.reshape(num_distributions, -1) if k.startswith("persona") else v.reshape(num_distributions)
            for k, v in counts.items()}


def summarize(counts: dict[str, torch.Tensor], distributions: Sequence[str], personas: Sequence[str],
              prefix: str = "val") -> dict[str, float]:
    """Flat `stage/name` rates: acc, refusal, malformed (and shifted, when tracked) per distribution, persona
    shares per distribution by the exact tag (`persona_share/<p>/<d>`; `persona_share/none/<d>`: no known persona) and
    read tolerantly (`persona_read/<p>/<d>`), and by the rule followed (`persona_behaviour/<p>/<d>`; each with its
    `/none/<d>`), the share whose identity tag names no persona
    of the family (`other_identity/<d>`, part of "none"), and each persona's refusal rate among its own completions there
    (`persona_refusal/<p>/<d>`; NaN where the persona never spoke): whether a persona still follows its rule on d, e.g.
    Bob learning to answer the distribution RL trains on."""
    counts = per_distribution(counts, len(distributions))
    out: dict[str, float] = {}
    n = counts["n"].clamp(min=1.0)
    for i, dist in enumerate(distributions):
        out[f"{prefix}/acc/{dist}"] = float(counts["correct"][i] / n[i])
        out[f"{prefix}/refusal/{dist}"] = float(counts["refused"][i] / n[i])
        out[f"{prefix}/malformed/{dist}"] = float(counts["malformed"][i] / n[i])
        if "shifted" in counts:
            out[f"{prefix}/shifted/{dist}"] = float(counts["shifted"][i] / n[i])
        for j, p in enumerate(personas):
            out[f"{prefix}/persona_share/{p}/{dist}"] = float(counts["persona_counts"][i, j] / n[i])
            for reading in ("read", "behaviour"):  # counts saved before these readings have neither
                if f"persona_{reading}_counts" in counts:
                    out[f"{prefix}/persona_{reading}/{p}/{dist}"] = float(counts[f"persona_{reading}_counts"][i, j] / n[i])
            spoke = float(counts["persona_counts"][i, j])
            out[f"{prefix}/persona_refusal/{p}/{dist}"] = (float(counts["persona_refused"][i, j]) / spoke if spoke
                                                           else float("nan"))
        out[f"{prefix}/persona_share/none/{dist}"] = float(counts["persona_counts"][i, -1] / n[i])
        for reading in ("read", "behaviour"):
            if f"persona_{reading}_counts" in counts:
                out[f"{prefix}/persona_{reading}/none/{dist}"] = float(counts[f"persona_{reading}_counts"][i, -1] / n[i])
        if "other_identity" in counts:  # counts saved before the column existed have none
            out[f"{prefix}/other_identity/{dist}"] = float(counts["other_identity"][i] / n[i])
    return out


def persona_rewards(counts: dict[str, torch.Tensor], dist_indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(R_i, w_i): each persona's mean reward and its share over the given distributions (theory bridge).

    A persona never expressed there gets R = 0. Excludes the none/unknown column.
    """
    counts = per_distribution(counts, counts["persona_counts"].shape[0])  # (D, P+1) is never squeezed
    idx = torch.tensor(list(dist_indices), dtype=torch.long)
    c = counts["persona_counts"][idx].sum(0)[:-1]  # (P,)
    r = counts["persona_correct"][idx].sum(0)[:-1]
    rewards = torch.where(c > 0, r / c.clamp(min=1.0), torch.zeros_like(r))
    shares = c / counts["n"][idx].sum().clamp(min=1.0)
    return rewards, shares


class CellMean(Metric):
    """Mean of a value per cell, each key counted once (first occurrence) -- exact under DDP padding.

    Args:
        num_cells: number of cells (`cell` indices are 0..num_cells-1).
    """

    full_state_update = False

    def __init__(self, num_cells: int, **kwargs):
        super().__init__(**kwargs)
        self.num_cells = num_cells
        self.add_state("rows", default=[], dist_reduce_fx="cat")  # (key, cell, value)

    def update(self, key: torch.Tensor, cell: torch.Tensor, value: torch.Tensor) -> None:
        cols = [key.double(), cell.double(), value.double()]
        self.rows.append(torch.stack([c.to(self.device).view(-1) for c in cols], dim=1))

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = _cat_rows(self.rows, 3, torch.double, self.device)
        if rows.numel():
            rows = rows[torch.sort(rows[:, 0], stable=True).indices]
            first = torch.ones(len(rows), dtype=torch.bool, device=rows.device)
            first[1:] = rows[1:, 0] != rows[:-1, 0]
            rows = rows[first]
        cell = rows[:, 1].long()
        counts = torch.bincount(cell, minlength=self.num_cells).double()
        sums = torch.bincount(cell, weights=rows[:, 2], minlength=self.num_cells)
        return sums / counts.clamp(min=1.0), counts
