"""Several weak teachers per seed (docs/multi_teacher.md): what the W2S protocol records of a multi-teacher student
(the learned mixture's weights, read from its checkpoint) and what its report prints (the weights per seed, beside
each teacher's own test accuracies). The extra teachers' stages are teachers, not rows of the method table: every
WRG / AOG / NTS there is against the main teacher.

Kept free of the protocol's configuration classes: the report reads the configuration by attribute only.
"""
from __future__ import annotations

import statistics
from typing import Optional

WEIGHTS_KEY = "objective.logits"  # `MultiTeacherSoftBT`'s parameter in a reward model's state dict


def checkpoint_teacher_weights(path: str, teachers: tuple[str, ...]) -> Optional[dict[str, float]]:
    """The simplex weights w = softmax(logits) saved in a multi-teacher student's checkpoint, by teacher name (the
    batches' column order); None when the checkpoint holds no mixture."""
    import torch

    state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)["state_dict"]
    logits = state.get(WEIGHTS_KEY)
    if logits is None:
        return None
    weights = torch.softmax(logits.float(), dim=0).tolist()
    if len(weights) != len(teachers):
        raise ValueError(f"{path}: its mixture has {len(weights)} weights, but the stage read {len(teachers)} "
                         f"teachers {list(teachers)}")
    return dict(zip(teachers, weights))


def extra_teacher_names(p) -> list[str]:
    return [e.name for e in p.extra_teachers]


def without_extra_teachers(p, raw: dict[str, dict[int, dict]]) -> dict[str, dict[int, dict]]:
    """The stage results without the extra teachers' (teachers, not rows: their test has no transfer scores)."""
    extra = set(extra_teacher_names(p))
    return {name: per_seed for name, per_seed in raw.items() if name not in extra}


def multi_teacher_record(p, raw: dict[str, dict[int, dict]], id_source: str, targets: list[str]) -> dict:
    """Per seed: every teacher's test accuracies (percent: ID, mean OOD) and the weights each multi-teacher stage
    learned (`teacher_weights` of its result; under the `weak_val` rule's stopping point too, when it has one).
    {} without extra teachers."""
    names = ["teacher", *extra_teacher_names(p)]
    if len(names) == 1:
        return {}
    seeds: dict[int, dict] = {}
    for seed in sorted(raw.get("teacher", {})):
        teachers = {}
        for name in names:
            test = (raw.get(name, {}).get(seed) or {}).get("test") or {}
            if id_source not in test:
                continue
            ood = [100.0 * test[t]["acc"] for t in targets if t in test]
            teachers[name] = {"id_acc": 100.0 * test[id_source]["acc"],
                              "ood_mean_acc": statistics.fmean(ood) if ood else None}
        weights, weak_val = {}, {}
        for stage, per_seed in raw.items():
            result = per_seed.get(seed) or {}
            if result.get("teacher_weights"):
                weights[stage] = result["teacher_weights"]
            alt = result.get("weak_val")
            if isinstance(alt, dict) and alt.get("teacher_weights"):
                weak_val[stage] = alt["teacher_weights"]
        seeds[seed] = {"teachers": teachers, "weights": weights, "weights_weak_val": weak_val}
    return {"teachers": names, "per_seed": seeds}


def multi_teacher_markdown(record: dict) -> str:
    """Per seed, a table: teacher -> its own test accuracies and each multi-teacher stage's weight."""
    if not record or not any(s["weights"] for s in record["per_seed"].values()):
        return ""
    lines = ["Multi-teacher students (docs/multi_teacher.md): the learned mixture w = softmax(logits) over the "
             "teachers at the checkpoint each kept (`weak_val`: at that rule's stopping point), beside the teachers' "
             "own test accuracies (percent). Every WRG / AOG / NTS above is against `teacher`, the main one."]
    for seed, entry in sorted(record["per_seed"].items()):
        stages = list(entry["weights"])
        cols = [f"w {s}" for s in stages] + [f"w {s} (weak_val)" for s in entry["weights_weak_val"]]
        lines += ["", f"Seed {seed}:", "", "| teacher | ID acc | mean OOD acc | " + " | ".join(cols) + " |",
                  "|---|---|---|" + "---|" * len(cols)]
        for name in record["teachers"]:
            acc = entry["teachers"].get(name, {})
            cells = [_pct(acc.get("id_acc")), _pct(acc.get("ood_mean_acc"))]
            cells += [_weight(entry["weights"][s].get(name)) for s in stages]
            cells += [_weight(w.get(name)) for w in entry["weights_weak_val"].values()]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.1f}"


def _weight(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.3f}"
