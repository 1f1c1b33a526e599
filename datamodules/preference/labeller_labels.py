"""A labelling function's weak-label file (`labelling_functions.py`): the student half's soft labels on the seeded
(a, b) order, its margins on every test split and on the validation split -- the format a trained teacher's file has
(`weak_labels.write_weak_labels`), so the data module reads both alike. Called by the data module in `prepare_data`.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

from datamodules.preference.labelling_functions import LabellingFunction, build_labeller
from datamodules.preference.weak_labels import check_informative, swap_order, write_weak_labels


def margins(labeller: LabellingFunction, records: list[dict], swaps: list[bool],
            resolve_source: Callable[[str], object]) -> list[float]:
    """(s_a − s_b) / T per record, a = rejected where swapped."""
    out = []
    for (chosen, rejected), swapped in zip(labeller.scores(records, resolve_source), swaps):
        a, b = (rejected, chosen) if swapped else (chosen, rejected)
        out.append((a - b) / labeller.temperature)
    return out


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def compute_labeller_labels(spec: str, student_records: list[dict], test_records: dict[str, list[dict]], seed: int,
                            out_path: str, validation_records: Optional[list[dict]],
                            resolve_source: Callable[[str], object]) -> dict:
    """The weak-label file of a labelling function (as `compute_weak_labels` writes a model's), at `out_path`."""
    labeller = build_labeller(spec)
    swaps = [swap_order(r["id"], seed) for r in student_records]
    student = margins(labeller, student_records, swaps, resolve_source)
    labels = {r["id"]: [sigmoid(m), s] for r, m, s in zip(student_records, student, swaps)}
    check_informative(student, [q for q, _ in labels.values()], spec)
    tests = {split: dict(zip((r["id"] for r in recs), margins(labeller, recs, [False] * len(recs), resolve_source)))
             for split, recs in test_records.items()}
    validation = None
    if validation_records:
        validation = dict(zip((r["id"] for r in validation_records),
                              margins(labeller, validation_records, [False] * len(validation_records),
                                      resolve_source)))
    return write_weak_labels(out_path, spec, seed, "none (labelling function)", labels, tests, validation)
