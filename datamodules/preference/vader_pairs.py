"""Pairs "which text do people rate more positive" from the VADER ICWSM corpus's rated texts, and its splits
(docs/vader_icwsm.md). Pure functions of the items and a seed: the adapter (`sources/vader_icwsm.py`) and the
supervisors' measurements (`analysis/vader_supervisors.py`) share them.

Pair rules (chosen = the text with the higher published mean rating; a pair whose gap |Δ mean| is below `min_delta`
is dropped, and Δ = 0 always: no preference):
- `sorted`: the items sorted by mean rating (ties in file order), item k paired with item k + N/2 (k < N/2):
  disjoint pairs, each text used once, far apart (the gap is about half the rating range).
- `random`: a seeded shuffle, items 2k and 2k+1 paired: disjoint pairs with the corpus's natural gaps (many small).
- `within_document`: every two sentences of one Amazon review or NYT article (closest to one prompt, two
  responses); a sentence is in several pairs.

Splits: the items (tweets, movie snippets) or the documents (Amazon reviews, NYT articles) are shuffled with a seed
and cut by `fractions`, *before* pairing, so no text -- and no review or article -- is in two splits.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from typing import Optional, Sequence

from datamodules.preference.vader_corpus import Item

PAIR_RULES = ("sorted", "random", "within_document")
DEFAULT_FRACTIONS = {"train": 0.7, "validation": 0.1, "test": 0.2}


def check_rule(rule: str, has_documents: bool, min_delta: float) -> None:
    if rule not in PAIR_RULES:
        raise ValueError(f"pairs {rule!r}: choose one of {list(PAIR_RULES)}")
    if rule == "within_document" and not has_documents:
        raise ValueError("pairs 'within_document' needs documents: only the amazon and nyt domains have them")
    if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not 0 <= min_delta <= 8:
        raise ValueError(f"min_delta must be a number in [0, 8] (the rating scale is -4 .. +4), got {min_delta!r}")


def check_fractions(fractions: dict) -> dict[str, float]:
    if set(fractions) != set(DEFAULT_FRACTIONS) or any(not isinstance(v, (int, float)) or isinstance(v, bool)
                                                       or v <= 0 for v in fractions.values()) \
            or not math.isclose(sum(fractions.values()), 1.0, abs_tol=1e-9):
        raise ValueError(f"split_fractions must give train, validation and test, each > 0, summing to 1; got "
                         f"{fractions}")
    return {k: float(fractions[k]) for k in DEFAULT_FRACTIONS}


def split_items(items: Sequence[Item], fractions: dict[str, float], seed: int) -> dict[str, list[Item]]:
    """Items per split, each split in file order. With documents (every item's `document` set), whole documents are
    assigned, so no document is in two splits; the cut is by number of documents."""
    fractions = check_fractions(fractions)
    by_document = all(it.document is not None for it in items)
    units = sorted({it.document for it in items}) if by_document else [it.id for it in items]
    random.Random(seed).shuffle(units)
    n = len(units)
    n_train = int(round(fractions["train"] * n))
    n_val = int(round(fractions["validation"] * n))
    assigned = {u: "train" for u in units[:n_train]}
    assigned.update({u: "validation" for u in units[n_train:n_train + n_val]})
    assigned.update({u: "test" for u in units[n_train + n_val:]})
    out: dict[str, list[Item]] = {k: [] for k in DEFAULT_FRACTIONS}
    for it in items:
        out[assigned[it.document if by_document else it.id]].append(it)
    return out


def make_pairs(items: Sequence[Item], rule: str, min_delta: float = 1.0, seed: int = 0,
               dropped: Optional[Counter] = None) -> list[tuple[Item, Item]]:
    """(chosen, rejected) pairs under `rule`; `dropped` (if given) counts the candidate pairs left out, by reason:
    `tie` (equal mean ratings), `small_gap` (0 < |Δ| < min_delta), `identical` (the same text twice)."""
    check_rule(rule, all(it.document is not None for it in items), min_delta)
    dropped = dropped if dropped is not None else Counter()
    if rule == "sorted":
        order = sorted(items, key=lambda it: it.mean)  # stable: ties keep file order
        half = len(order) // 2
        candidates = [(order[k], order[k + half]) for k in range(half)]
    elif rule == "random":
        order = list(items)
        random.Random(seed).shuffle(order)
        candidates = [(order[2 * k], order[2 * k + 1]) for k in range(len(order) // 2)]
    else:
        documents: dict[str, list[Item]] = {}
        for it in items:
            documents.setdefault(it.document, []).append(it)
        candidates = [(a, b) for members in documents.values() for i, a in enumerate(members) for b in members[i + 1:]]
    pairs = []
    for a, b in candidates:
        gap = abs(a.mean - b.mean)
        if gap == 0:
            dropped["tie"] += 1
        elif gap < min_delta:
            dropped["small_gap"] += 1
        elif a.text == b.text:
            dropped["identical"] += 1
        else:
            pairs.append((a, b) if a.mean > b.mean else (b, a))
    return pairs
