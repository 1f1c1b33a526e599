"""The weak teacher's recipe, fitted per dataset (issue 29, docs/teacher_structure.md "The fitted teacher recipe").

The teacher the W2S failure needs is *partially* right where a shortcut misleads: on the in-distribution pairs where
the shortcut points at the rejected response it follows the rule on some and the shortcut on the rest, and its
errors concentrate there. A teacher right on none of them is imitated (a student has nothing to amplify but the
shortcut, and the teacher already sits at the anti-correlated floor); one right on nearly all of them is a rule
teacher (the student amplifies the rule). Where a given teacher lands depends on the data, so the recipe is a
search, run for every seed on the teacher's own data:

1. fit the teacher once per candidate value of one capacity knob that every source has (default:
   `--model.vocab_limit`, how many of the tokenizer's most frequent entries the teacher can read; the rest are
   [UNK]: it knows the words of some subjects and not of others);
2. fit the response-only shortcut probe on the teacher half's gold pairs (`protocols.w2s.shortcut_probe`) and read each
   candidate's structure on the **validation split** — in-distribution, disjoint from both halves, the split the
   teacher already picks its checkpoint on. No student-half label, no target data, no generator metadata;
3. keep the candidate whose accuracy on the probe-wrong validation pairs is closest to `target` among those in
   `band` whose errors concentrate where the probe is wrong (`choose`).

Every candidate's figures and the rule that decided are recorded in the teacher stage's `result.json`
(`teacher_search`), with the chosen teacher's structure on the student half and every test split
(`teacher_structure`, report only).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from protocols.engine.stats import percent

VALUE_LABELS = {None: "full"}


@dataclass
class TeacherSearch:
    """Which knob the teacher's recipe searches, over which values, and what structure it aims at.

    Args:
        flag: a `cli.py` flag of the teacher stage (every source and backbone has it), e.g. "--model.vocab_limit".
        values: candidate values, from the most capable teacher down (a tie in distance goes to the earlier one);
            null is the flag's "off" (e.g. the full vocabulary).
        target: the accuracy (percent) on the validation pairs where the shortcut probe is wrong that the search
            aims at: partial rule-following, between a teacher the student imitates (≈ 0) and a rule teacher (≈ 100).
        band: candidates whose accuracy there lies outside [low, high] count as missing the structure.
        min_pairs: fewer probe-wrong validation pairs than this and the instrument cannot place a teacher (that
            count depends on the probe and the data, not on the teacher, so it is known before any fit): the search
            then fits the first candidate only, an ordinary teacher, and says so.
        stop_below_band: with values ordered by capacity, stop at the first candidate right on fewer than band[0]
            percent of the probe-wrong pairs once one candidate was eligible, or when every candidate so far is
            below the band: less capacity only knows less of the rule (saves the fits of the smaller teachers).
        budget_factors: when every candidate measured is below the band — the most capable one included — the
            values are walked down again with `--trainer.max_epochs` times the next factor (the same stop rule),
            until a walk finds a candidate that is not below the band: with more training a teacher learns more of
            the rule (the shortcut is learned first).
    """

    flag: str = "--model.vocab_limit"
    values: list = field(default_factory=lambda: [None, 20000, 14000, 10000, 7000, 5000])
    target: float = 40.0
    band: list[float] = field(default_factory=lambda: [20.0, 60.0])
    min_pairs: int = 10
    stop_below_band: bool = True
    budget_factors: list[int] = field(default_factory=lambda: [2, 4])

    def __post_init__(self) -> None:
        if not re.fullmatch(r"--(model|data|trainer)\.[A-Za-z0-9_.]+", self.flag or ""):
            raise ValueError(f"--teacher_search.flag must be a cli.py flag like '--model.vocab_limit', got "
                             f"{self.flag!r}")
        if not self.values:
            raise ValueError("--teacher_search.values is empty: give the candidate values of "
                             f"{self.flag}")
        labels = [value_label(v) for v in self.values]
        if len(set(labels)) != len(labels):
            raise ValueError(f"--teacher_search.values repeats a value: {self.values}")
        if not isinstance(self.band, (list, tuple)) or len(self.band) != 2:
            raise ValueError(f"--teacher_search.band takes two numbers [low, high] (percent), got {self.band!r}")
        low, high = self.band
        if not 0.0 <= low <= self.target <= high <= 100.0:
            raise ValueError(f"--teacher_search: need 0 <= band[0] <= target <= band[1] <= 100, got target "
                             f"{self.target} and band {self.band}")
        if self.min_pairs < 1:
            raise ValueError(f"--teacher_search.min_pairs must be >= 1, got {self.min_pairs}")
        if any(not isinstance(f, int) or f < 2 for f in self.budget_factors) or \
                list(self.budget_factors) != sorted(set(self.budget_factors)):
            raise ValueError("--teacher_search.budget_factors takes increasing integers >= 2 (multiples of the "
                             f"teacher's --trainer.max_epochs), got {self.budget_factors}")

    def candidate_args(self, value: Any) -> list[str]:
        return [f"{self.flag}={json.dumps(value)}"]


def value_label(value: Any) -> str:
    """A candidate's folder name and table cell: the value, `full` for null, `r16-alpha32` for {"r": 16, "alpha": 32}."""
    if value is None:
        return VALUE_LABELS[None]
    if isinstance(value, dict):
        return "-".join(f"{value_label(k)}{value_label(v)}" for k, v in value.items())
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value))


def candidate_figures(structure: dict, value: Any, checkpoint: str, val_acc: Optional[float], args: list[str],
                      budget: int = 1) -> dict:
    """One candidate's row: its value, budget factor, flags and checkpoint, and its structure on validation."""
    return {"value": value, "budget": budget, "args": args, "checkpoint": checkpoint, "val_acc": val_acc,
            "probe_wrong_acc": structure["probe_wrong"]["teacher_acc"],
            "probe_wrong_pairs": structure["probe_wrong"]["pairs"],
            "shortcut_error_share": structure["shortcut_error_share"],
            "probe_wrong_share": structure["probe_wrong_share"], "teacher_acc": structure["teacher_acc"]}


def concentrated(c: dict) -> bool:
    """The candidate's errors sit where the shortcut misleads more often than the pairs do (its errors are not
    spread at random over the split). No error at all is no concentration."""
    return c["shortcut_error_share"] is not None and c["shortcut_error_share"] > c["probe_wrong_share"]


def choose(candidates: list[dict], spec: TeacherSearch) -> tuple[int, str]:
    """Index of the chosen candidate and the rule that chose it (a sentence for the table and results.json)."""
    measurable = [i for i, c in enumerate(candidates) if c["probe_wrong_pairs"] >= spec.min_pairs
                  and c["probe_wrong_acc"] is not None]
    if not measurable:
        return 0, (f"instrument blind: fewer than {spec.min_pairs} validation pairs where the shortcut probe is "
                   "wrong, so no teacher can be placed; kept the first candidate")
    low, high = spec.band
    distance = lambda i: abs(candidates[i]["probe_wrong_acc"] - spec.target)  # noqa: E731
    eligible = [i for i in measurable if _eligible(candidates[i], spec)]
    if eligible:
        best = min(eligible, key=lambda i: (distance(i), i))
        return best, (f"closest to {spec.target:g}% right on the probe-wrong validation pairs among the candidates "
                      f"in [{low:g}, {high:g}]% with errors concentrated there")
    best = min(measurable, key=lambda i: (distance(i), i))
    return best, (f"no candidate in [{low:g}, {high:g}]% with concentrated errors: kept the closest to "
                  f"{spec.target:g}% (the structure is missed; read the candidates)")


def stops(candidates: list[dict], spec: TeacherSearch) -> bool:
    """The last candidate fell below the band after an eligible one, or every candidate so far is below it:
    smaller ones would only fall further."""
    return _below(candidates[-1], spec) and (any(_eligible(c, spec) for c in candidates[:-1])
                                             or all(_below(c, spec) for c in candidates))


def _below(c: dict, spec: TeacherSearch) -> bool:
    return c["probe_wrong_acc"] is not None and c["probe_wrong_acc"] < spec.band[0]


def needs_budget(candidates: list[dict], spec: TeacherSearch, blind: bool) -> bool:
    """Every candidate measured is below the band, the most capable one included: more training, not less capacity."""
    return not blind and bool(spec.budget_factors) and bool(candidates) and all(_below(c, spec) for c in candidates)


def _eligible(c: dict, spec: TeacherSearch) -> bool:
    return (c["probe_wrong_pairs"] >= spec.min_pairs and c["probe_wrong_acc"] is not None
            and spec.band[0] <= c["probe_wrong_acc"] <= spec.band[1] and concentrated(c))


def run_search(spec: TeacherSearch, stage_dir: str, args: list[str], data_init: dict, seed: int,
               fit: Callable[[list[str], str], tuple[str, Optional[float]]], max_epochs: Optional[int] = None) -> dict:
    """Fit every candidate (`fit(extra_args, candidate_dir) -> (checkpoint, best val acc)`), measure each on the
    validation split, choose. Returns the `teacher_search` record; its "checkpoint" is the chosen teacher's."""
    from protocols.w2s.shortcut_probe import ShortcutProbe, load_split_records, split_structure

    records, dm = load_split_records(data_init, seed)
    if not records["validation"]:
        raise ValueError(f"teacher search in {stage_dir}: the validation split is empty; the search reads the "
                         "teacher's structure there")
    probe = ShortcutProbe.fit(records["train_teacher"], seed=seed)
    probe_margins = probe.margins(records["validation"])
    blind = sum(m < 0 for m in probe_margins) < spec.min_pairs
    knob = spec.flag.rsplit(".", 1)[-1]
    candidates = []

    def measure(value: Any, extra: list[str], folder: str, budget: int = 1) -> None:
        ckpt, val_acc = fit(extra, os.path.join(stage_dir, "search", folder))
        margins = teacher_margins(ckpt, records["validation"], dm)
        candidates.append(candidate_figures(split_structure(margins, probe_margins), value, ckpt, val_acc, extra,
                                            budget))

    for budget in [1, *spec.budget_factors]:  # the vocabulary walked down at one budget, a longer one if all fell below
        if budget > 1 and not needs_budget(candidates, spec, blind):
            break
        if budget > 1 and not max_epochs:
            raise ValueError(f"teacher search in {stage_dir}: budget_factors need the teacher's --trainer.max_epochs")
        level: list[dict] = []
        for value in spec.values[:1] if blind else spec.values:
            extra = spec.candidate_args(value) + ([f"--trainer.max_epochs={budget * max_epochs}"] if budget > 1 else [])
            measure(value, extra, f"{knob}={value_label(value)}" + (f"-epochs{budget * max_epochs}" if budget > 1
                                                                     else ""), budget)
            level.append(candidates[-1])
            if spec.stop_below_band and stops(level, spec):
                break
    index, rule = choose(candidates, spec)
    return {**asdict(spec), "candidates": candidates, "chosen": candidates[index]["value"],
            "chosen_budget": candidates[index]["budget"], "chosen_args": candidates[index]["args"],
            "checkpoint": candidates[index]["checkpoint"], "val_acc": candidates[index]["val_acc"], "rule": rule,
            "probe": {"l2": probe.l2, "fit_pairs": len(records["train_teacher"]),
                      "validation_pairs": len(records["validation"]),
                      "shortcut_strength": probe.accuracy(records["validation"])}}


def replays_the_same(finished: dict, spec: TeacherSearch) -> bool:
    """Whether this search, run on the finished stage's data, would fit the same candidates and keep the same one —
    read from its recorded candidates (every fit is deterministic). A search recorded before an option existed is
    then no change: the option did not come into play."""
    done = finished.get("candidates") or []
    if not done:
        return False
    blind = str(finished.get("rule", "")).startswith("instrument blind")
    replay = []
    for c in done:
        replay.append(c)
        if blind or (spec.stop_below_band and stops(replay, spec)):
            break
    if len(replay) != len(done) or needs_budget(replay, spec, blind):
        return False
    return done[choose(replay, spec)[0]]["checkpoint"] == finished.get("checkpoint")


def teacher_margins(ckpt: str, records: list[dict], dm) -> list[float]:
    """The teacher's chosen − rejected margins on `records`, as the weak labels score pairs."""
    from lightning_modules.reward.weak_labeller import load_teacher, score_pairs
    from datamodules.tokenizers import load_tokenizer

    model = load_teacher(ckpt, "--ckpt").eval()
    return score_pairs(model, load_tokenizer(model.tokenizer_name), records, [False] * len(records),
                       dm.hparams.max_length, dm.hparams.truncation)


def search_markdown(searches: dict[int, dict]) -> str:
    """One line per seed: the knob, what was chosen and why, and every candidate's validation figures."""
    lines = []
    for seed, s in sorted(searches.items()):
        cells = ", ".join(
            f"{value_label(c['value'])}{_budget(c)}: {percent(c['probe_wrong_acc'], '%')} of {c['probe_wrong_pairs']}"
            f" (errors there {percent(c['shortcut_error_share'], '%')}, val acc {percent(c['val_acc'], '%')})"
            for c in s["candidates"])
        lines.append(f"- seed {seed}: {s['flag']} = **{value_label(s['chosen'])}**"
                     f"{_budget({'budget': s.get('chosen_budget', 1)})} — {s['rule']}. Right on the "
                     f"probe-wrong validation pairs: {cells}. Shortcut strength "
                     f"{percent(s['probe']['shortcut_strength'], '%')}.")
    return "\n".join(lines)


def _budget(c: dict) -> str:
    return f" (×{c['budget']} epochs)" if c.get("budget", 1) > 1 else ""

