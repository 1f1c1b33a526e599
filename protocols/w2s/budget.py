"""What each row of a W2S table cost and how many candidates its selection rule picked among (issue 36), and the
same-step comparison of methods whose every validation was tested (`Method.test_every_validation`).

A row's **candidates** are the models whose validation score its rule compares: one per fitted stage that keeps its
last checkpoint, one per validation of a stage that keeps its best (early stopping), one per evaluated variant; a
method that evaluates a swept method's checkpoints adds that method's candidates (its source is picked first). A
method that reads another's fit (`trajectory`) costs its evaluations only: the fit is counted in its source's row. A
rule that picks among more candidates has more chances to fit the validation split's noise, so rows are compared
at matched budgets (docs/results.md).
"""
from __future__ import annotations

import statistics
from typing import Optional

from protocols.engine.stats import ci95, mean_std


def stage_candidates(result: dict) -> Optional[int]:
    """How many checkpoints of one stage its rule compares (None: a result from before validations were recorded)."""
    if (result.get("identity") or {}).get("checkpoint") == "best":
        validations = result.get("validations")
        return len(validations) if validations is not None else None
    return 1


def budget(p, raw: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """Per row (method, or fixed row): fits, evaluations and candidates per seed (the mean over seeds; they are equal
    unless a run's validations differ), from the stage results."""
    from protocols.w2s.model_selection import fixed_stage, method_stages

    groups = method_stages(p)
    by_name = {m.name: m for m in p.methods}
    out: dict[str, dict] = {}
    for method, stages in groups.items():
        seeds = sorted({s for name, _ in stages for s in raw.get(name, {})})
        per_seed = []
        for seed in seeds:
            results = [raw[name][seed] for name, _ in stages if seed in raw.get(name, {})]
            evaluations = sum(1 for r in results if r.get("evaluated") or r.get("pretrained"))
            counts = [stage_candidates(r) for r in results]
            candidates = None if None in counts else sum(counts)
            source = by_name[method].from_method
            if source and candidates is not None and len(groups.get(source, [])) > 1:
                nested = out.get(source, {}).get("per_seed", {}).get(seed, {}).get("candidates")
                candidates = None if nested is None else candidates + nested
            per_seed.append((seed, {"fits": len(results) - evaluations, "evaluations": evaluations,
                                    "candidates": candidates}))
        out[method] = {"per_seed": dict(per_seed), **_means(dict(per_seed))}
        if by_name[method].trajectory:  # its fit is counted once, in its source's row
            out[method]["trajectory"] = by_name[method].trajectory
    for m in p.methods:
        stage = fixed_stage(m, groups)
        if stage is None:
            continue
        per_seed = {seed: {"fits": 1, "evaluations": 0, "candidates": stage_candidates(r)}
                    for seed, r in sorted(raw.get(stage, {}).items())}
        out[m.name] = {"per_seed": per_seed, **_means(per_seed), "fixed": dict(m.fixed)}
    return out


def _means(per_seed: dict) -> dict:
    def mean(key: str) -> Optional[float]:
        values = [v[key] for v in per_seed.values()]
        return None if not values or None in values else statistics.fmean(values)
    return {"fits": mean("fits"), "evaluations": mean("evaluations"), "candidates": mean("candidates")}


def budget_markdown(table: dict[str, dict], rows: list[str]) -> str:
    """The budget of the table's rows, in its order."""
    lines = ["Budget per seed: fits, evaluations (validate + test of a fitted checkpoint), and the candidates the "
             "selection rule picks among (a validation of an early-stopping fit is one candidate; a nested "
             "selection counts its source's):", "", "| method | fits | evaluations | candidates |", "|---|---|---|---|"]
    cell = lambda v: "?" if v is None else f"{v:g}"  # noqa: E731
    for row in rows:
        b = table.get(row)
        if b is None:
            continue
        note = f" (= {b['fixed']['method']} at {b['fixed']['value']}, fixed in advance)" if "fixed" in b else \
            f" (the final weights of {b['trajectory']}'s fits)" if "trajectory" in b else ""
        lines.append(f"| {row}{note} | {cell(b['fits'])} | {cell(b['evaluations'])} | {cell(b['candidates'])} |")
    return "\n".join(lines)


def same_step(p, raw: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """NTS at every tested validation step of each `test_every_validation` method: {method: {step: cell}}, a cell
    being mean / std / 95% interval / per-seed values over the seeds; plus, for the first two such methods, their
    per-seed paired difference at each step (`paired`)."""
    methods = [m for m in p.methods if getattr(m, "test_every_validation", False) and not m.sweep]
    out: dict[str, dict] = {}
    for m in methods:
        per_step: dict[str, dict[int, float]] = {}
        for seed, result in sorted(raw.get(m.name, {}).items()):
            for step, entry in (result.get("by_step") or {}).items():
                per_step.setdefault(step, {})[seed] = entry["test"]["transfer"]["nts"]
        out[m.name] = {step: _cell(values) for step, values in sorted(per_step.items(), key=lambda kv: int(kv[0]))}
    if len(methods) >= 2:
        a, b = methods[0].name, methods[1].name
        out["paired"] = {"reference": a, "other": b, "steps": {
            step: _cell({s: out[a][step]["per_seed"][s] - out[b][step]["per_seed"][s]
                         for s in set(out[a][step]["per_seed"]) & set(out[b].get(step, {}).get("per_seed", {}))})
            for step in out[a] if step in out[b]}}
    return out


def _cell(values: dict) -> dict:
    m, sd, n = mean_std(list(values.values()))
    return {"mean": m, "std": sd, "n": n, "ci95": ci95(m, sd, n), "per_seed": values}


def same_step_markdown(table: dict[str, dict]) -> str:
    if not table:
        return ""
    methods = [k for k in table if k != "paired"]
    steps = sorted({s for m in methods for s in table[m]}, key=int)
    paired = table.get("paired")
    head = ["step", *[f"NTS {m}" for m in methods]] + ([f"{paired['reference']} − {paired['other']} [95% CI]"]
                                                       if paired else [])
    lines = ["Same-step comparison: NTS of the checkpoint at each validation step (mean ± std over seeds), every "
             "checkpoint tested:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for step in steps:
        cells = [_fmt(table[m].get(step)) for m in methods]
        if paired:
            d = paired["steps"].get(step)
            cells.append("–" if d is None else f"{d['mean']:+.1f}" + (
                f" [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]" if d["ci95"] else " (one seed)"))
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(cell: Optional[dict]) -> str:
    if cell is None:
        return "–"
    return f"{cell['mean']:+.1f}" + (f" ± {cell['std']:.1f}" if cell["std"] is not None else "")
