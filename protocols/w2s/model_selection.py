"""Model selection for swept methods, and paired comparisons between methods (issue 23, docs/w2s.md "Model
selection").

A method with a `sweep` has one stage per value and one row per seed: the stage the rule picks.

- `id_val` (the protocol's table): the highest accuracy on the ID **validation** split of the source (gold labels,
  disjoint from both halves and from every test split) of the checkpoint the stage keeps. No target data.
- `weak_val` (the strict weak-to-strong reading, beside it): the highest agreement with the *teacher's* labels on the
  same validation pairs (`val_weak_acc`); an early-stopping stage is read at its `weak_val` stopping point (the
  checkpoint kept by `callbacks.validation_history`). No gold label and no target data. A row whose value is nested
  on another method's `id_val` pick (an evaluating method of a swept source) has no `weak_val` reading.
- `oracle_target` (reported beside it, an upper bound, never a result): the highest mean accuracy on the OOD target
  **test** splits — the rule the λ of earlier tables was read with.

A `fixed` row (`Method.fixed`) reads one stage of a swept method at a value fixed in advance, under every rule.

Ties go to the earlier value of the sweep. Methods share teachers and data per seed, so two methods are compared by
the per-seed paired difference of their NTS, with its mean and a 95% Student-t interval over seeds (`paired`).
"""
from __future__ import annotations

import statistics
from typing import Any, Optional

from protocols.engine.stats import ci95

RULES = ("id_val", "weak_val", "oracle_target")


def method_stages(p) -> dict[str, list[tuple[str, Any]]]:
    """Each method's stages and swept values, in sweep order: {method: [(stage name, value), ...]}."""
    return {m.name: [(name, value) for name, value, _ in m.variants()] for m in p.stage_methods()}


def read_under(raw: dict[str, dict[int, dict]], rule: str) -> dict[str, dict[int, dict]]:
    """The stage results as `rule` reads them: under `weak_val`, an early-stopping stage's result is its `weak_val`
    stopping point's (its checkpoint, step, validation scores and test results); other rules read them as they are.
    """
    if rule != "weak_val":
        return raw
    out: dict[str, dict[int, dict]] = {}
    for name, per_seed in raw.items():
        out[name] = {}
        for seed, stage in per_seed.items():
            alt = stage.get("weak_val")
            out[name][seed] = {**stage, **alt} if isinstance(alt, dict) else stage
            if alt is None and (stage.get("identity") or {}).get("checkpoint") == "best" and "test" in stage:
                out[name][seed] = {**stage, "val_weak_acc": None}  # its kept checkpoint was chosen on gold
    return out


def available(raw: dict[str, dict[int, dict]], p, rule: str) -> list[str]:
    """Why `rule` cannot read this run: the stage folders lacking what it needs ([] when it can)."""
    if rule != "weak_val":
        return []
    nested, read = nested_on_id_val(p), read_under(raw, rule)
    return [f"seed{seed}/{name}" for method, stages in method_stages(p).items() if method not in nested
            for name, _ in stages if name in read for seed, stage in sorted(read[name].items())
            if stage.get("val_weak_acc") is None]


def rule_score(stage: dict, rule: str, targets: list[str], where: str) -> float:
    """What the rule maximises for one stage's result (percent)."""
    if rule == "id_val":
        if stage.get("val_acc") is None:
            raise ValueError(f"{where}: its result.json has no val_acc (finished before model selection existed, "
                             "or without a validation split): rerun it with --force")
        return float(stage["val_acc"])
    if rule == "weak_val":
        if stage.get("val_weak_acc") is None:
            raise no_weak_val(where)
        return float(stage["val_weak_acc"])
    if rule == "oracle_target":
        if not targets:
            raise ValueError(f"{where}: oracle_target selection needs OOD targets")
        return statistics.fmean(100.0 * stage["test"][t]["acc"] for t in targets)
    raise ValueError(f"unknown model-selection rule {rule!r}; the rules are {RULES}")


def pick(scores: list[float]) -> int:
    """The index a rule picks: the highest score, ties to the earlier value of the sweep."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def select(p, raw: dict[str, dict[int, dict]], rule: str, targets: list[str]
           ) -> tuple[dict[str, dict[int, dict]], dict[str, dict[int, Any]]]:
    """`raw` (stage name -> seed -> result) with each swept method's stages replaced by the one the rule picks per
    seed, under the method's name; and the picked value per swept method and seed."""
    missing = available(raw, p, rule)
    if missing:
        raise no_weak_val(f"{p.out_dir}/{missing[0]}" + (f" (and {len(missing) - 1} more stage(s))"
                                                          if len(missing) > 1 else ""))
    raw = read_under(raw, rule)
    groups = method_stages(p)
    swept = {m: stages for m, stages in groups.items() if m not in raw}  # a swept method's stages carry "@"
    row_of = {name: m for m, stages in swept.items() for name, _ in stages}
    ordered: dict[str, dict[int, dict]] = {}
    picked: dict[str, dict[int, Any]] = {}
    skip = nested_on_id_val(p) if rule == "weak_val" else set()  # (the oracle's upper bound keeps them, as before)
    for name, per_seed in raw.items():  # rows in the stages' order, a swept method once, where its first stage is
        method = row_of.get(name)
        if (method or name) in skip:
            continue
        if method is None:
            ordered[name] = per_seed
        elif method not in ordered:
            stages = swept[method]
            ordered[method], picked[method] = {}, {}
            for seed in sorted(per_seed):
                scores = [rule_score(raw[s][seed], rule, targets, f"{p.out_dir}/seed{seed}/{s}") for s, _ in stages]
                best = pick(scores)
                ordered[method][seed] = raw[stages[best][0]][seed]
                picked[method][seed] = stages[best][1]
    for m in p.methods:  # the rows at a value fixed in advance: no selection
        stage = fixed_stage(m, groups)
        if stage in raw:
            ordered[m.name] = raw[stage]
    return in_method_order(p, ordered), picked


def in_method_order(p, rows: dict) -> dict:
    """The rows with the methods' rows in their declared order: a fit other methods read runs before its readers
    (`stages._fit_order`), and is listed where it was declared; the other rows keep their places."""
    names = [m.name for m in p.stage_methods()]
    methods = iter(sorted((k for k in rows if k in names), key=names.index))
    return {key: rows[key] for key in (next(methods) if k in names else k for k in rows)}


def fixed_stage(m, groups: dict[str, list[tuple[str, Any]]]) -> Optional[str]:
    """The stage a `fixed` row reads (its method's stage at the fixed value); None for any other row."""
    from protocols.w2s.teacher_search import value_label

    if m.fixed is None or m.fixed["method"] not in groups:
        return None
    return next(n for n, v in groups[m.fixed["method"]] if value_label(v) == value_label(m.fixed["value"]))


def no_weak_val(where: str) -> ValueError:
    return ValueError(f"{where}: its result.json has no val_weak_acc (finished before the weak_val rule existed, or "
                      "its validation split has no teacher labels): rerun it with --force")


def nested_on_id_val(p) -> set[str]:
    """Methods that evaluate a swept method's checkpoints: their source is its `id_val` pick (`evaluated_stage`),
    so under another rule they would read gold through it; they have no row there."""
    swept = {m.name for m in p.stage_methods() if m.sweep}
    return {m.name for m in p.stage_methods() if m.from_method in swept}


def selection_record(p, raw: dict[str, dict[int, dict]], targets: list[str]) -> dict[str, dict]:
    """Per swept method: the flag, the values, each rule's pick per seed, and every value's scores per seed."""
    record, weak = {}, read_under(raw, "weak_val")
    for m in p.stage_methods():
        if not m.sweep:
            continue
        stages = [(name, value) for name, value, _ in m.variants()]
        seeds = sorted(raw[stages[0][0]])
        scores = {seed: [{"value": value, "val_acc": raw[name][seed].get("val_acc"),
                          "val_weak_acc": weak[name][seed].get("val_weak_acc"),
                          "target_acc": rule_score(raw[name][seed], "oracle_target", targets, name) if targets
                          else None} for name, value in stages] for seed in seeds}
        record[m.name] = {"flag": m.sweep_flag, "values": m.sweep[m.sweep_flag], "scores": scores}
    for rule in RULES:
        if rule == "oracle_target" and not targets or available(raw, p, rule):
            continue
        _, picked = select(p, raw, rule, targets)
        for method, per_seed in picked.items():
            if method in record:
                record[method][rule] = per_seed
    return record


def paired(table: dict, reference: str, key: str = "nts") -> dict[str, dict]:
    """For every other weak-label method X: the per-seed difference key(reference) − key(X) on the seeds both
    have, with its mean, std and 95% t-interval."""
    if reference not in table or key not in table[reference]:
        return {}
    ref = table[reference][key]["per_seed"]
    out = {}
    for method, row in table.items():
        if method in (reference, "teacher", "ceiling") or key not in row:
            continue
        seeds = sorted(set(ref) & set(row[key]["per_seed"]), key=int)
        diffs = {s: ref[s] - row[key]["per_seed"][s] for s in seeds}
        if not diffs:
            continue
        values = list(diffs.values())
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else None
        out[method] = {"per_seed": diffs, "mean": mean, "std": std, "n": len(values), "ci95": ci95(mean, std, len(values))}
    return out


def paired_markdown(pairs: dict[str, dict], reference: str, key: str = "NTS") -> str:
    if not pairs:
        return ""
    lines = [f"Paired differences {key}({reference}) − {key}(X), per seed (methods share teachers and data), mean "
             "[95% t-interval]:", "", "| X | mean [95% CI] | per seed |", "|---|---|---|"]
    for method, d in pairs.items():
        interval = (f" [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]" if d["ci95"] else " (one seed)")
        seeds = ", ".join(f"{v:+.1f}" for _, v in sorted(d["per_seed"].items(), key=lambda kv: int(kv[0])))
        lines.append(f"| {method} | {d['mean']:+.1f}{interval} | {seeds} |")
    return "\n".join(lines)


def selection_markdown(record: dict[str, dict], rule: str) -> str:
    """One line per swept method: the value the rule picked in each seed."""
    if not record:
        return ""
    what = {"id_val": " (the ID validation split of the source; no target data)",
            "weak_val": " (agreement with the teacher's labels on the ID validation split; no gold, no target data)",
            "oracle_target": " (the target test splits: an upper bound)"}[rule]
    lines = [f"Model selection `{rule}`{what}: the value each swept method's row took, per seed."]
    for method, r in record.items():
        if rule not in r:
            continue
        picks = r.get(rule) or {}
        cells = ", ".join(f"seed {s}: {_value(v)}" for s, v in sorted(picks.items(), key=lambda kv: int(kv[0])))
        values = ", ".join(_value(v) for v in r["values"])
        lines.append(f"- {method} ({r['flag']} ∈ {{{values}}}): {cells}")
    return "\n".join(lines)


def _value(v: Optional[Any]) -> str:
    from protocols.w2s.teacher_search import value_label

    return "null" if v is None else f"{v:g}" if isinstance(v, float) else value_label(v)
