"""Tables over seeds for `protocols.mixture`: every RL stage's before/after table and evaluation history as
mean ± std (sample std, n − 1) with the per-seed values, and the SFT stage's stop step and persona fidelity.

Per-seed inputs are the `<name>_table.json` files of `PersonaTrackingCallback` (rows + history). A seed's
"dominant persona" can differ; the tables report the share of the persona that dominates the most seeds at the end
(named in the header) and list each seed's winner.

A seed whose completions on a distribution mostly carry no persona tag at the end (the parser's "none" share above
every persona's) has no dominant persona there, though its table row still names the largest of the small shares.
The "dominant after" cell counts such seeds apart ("Alice (1/3 seeds), no tag (2/3 seeds)"), so a persona is never
said to dominate where it writes nothing. The share columns keep following the modal name over all seeds (the rule
the published tables were made with, so their numbers do not change); the cell names it when it is not the tagged
seeds' first ("...; shares: 2024").
"""
from __future__ import annotations

import json
import math
import os
from collections import Counter
from typing import Optional

from datamodules.atomic_files import atomic_write
from protocols.engine import stats
from protocols.engine.machine import fingerprint
from protocols.engine.published_set import register_readers, remove_stale, write_set_record
from protocols.engine.run_files import publish_set


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (NaN for one value) of values without NaNs (`protocols.engine.stats.mean_std`)."""
    mean, std, _ = stats.mean_std(values)
    return mean, float("nan") if std is None else std


def cell(values: list[float], per_seed: bool = True, digits: int = 2) -> str:
    """'0.31 ± 0.05 (0.28, 0.36, 0.30)'; one value: '0.31 (1 seed)'. NaN values (a rate over no samples, e.g. a
    persona's refusal rate once it no longer speaks) are left out, and the cell says over how many seeds."""
    present = [v for v in values if not math.isnan(v)]
    if not present:
        return "–"
    if len(present) < len(values):
        mean, std = mean_std(present)
        text = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if len(present) > 1 else "")
        return text + f" ({len(present)} of {len(values)} seeds)"
    mean, std = mean_std(values)
    if len(values) == 1:
        return f"{mean:.{digits}f} (1 seed)"
    text = f"{mean:.{digits}f} ± {std:.{digits}f}"
    return text + (" (" + ", ".join(f"{v:.{digits}f}" for v in values) + ")" if per_seed else "")


def stage_summary(tables: dict[int, dict]) -> dict:
    """{seeds, distributions, trained, winner per distribution, per-seed winners, rows: {dist: {column: [values]}},
    history: {step: {key: [values]}}} over the seeds' tables."""
    seeds = sorted(tables)
    first = tables[seeds[0]]
    dists = [r["distribution"] for r in first["rows"]]
    trained = [r["distribution"] for r in first["rows"] if r["trained"]]
    winners = {d: {s: _row(tables[s], d)["dominant_after"] for s in seeds} for d in dists}
    modal = {d: Counter(winners[d].values()).most_common(1)[0][0] for d in dists}
    untagged = {d: {s: _untagged(tables[s], d) for s in seeds} for d in dists}
    rows = {}
    for d in dists:
        cols = {k: [_row(tables[s], d)[k] for s in seeds] for k in
                ("acc_before", "acc_after", "refusal_before", "refusal_after", "malformed_after")}
        cols["share_before"] = [_share(tables[s]["history"][0], modal[d], d) for s in seeds]
        cols["share_after"] = [_share(tables[s]["history"][-1], modal[d], d) for s in seeds]
        if f"val/shifted/{d}" in first["history"][-1]["metrics"]:  # non-refusal variants
            cols["shifted_before"] = [tables[s]["history"][0]["metrics"][f"val/shifted/{d}"] for s in seeds]
            cols["shifted_after"] = [tables[s]["history"][-1]["metrics"][f"val/shifted/{d}"] for s in seeds]
        rows[d] = cols
    steps = sorted(set.intersection(*(set(h["step"] for h in tables[s]["history"]) for s in seeds)))
    foreign = [d for d in dists if _names_foreign_identity(tables, d)]
    history = {}
    for step in steps:
        at = {s: next(h for h in tables[s]["history"] if h["step"] == step)["metrics"] for s in seeds}
        entry = {}
        for d in dists:
            entry[f"acc {d}"] = [at[s][f"val/acc/{d}"] for s in seeds]
            entry[f"refusal {d}"] = [at[s][f"val/refusal/{d}"] for s in seeds]
            entry[f"{modal[d]} share {d}"] = [at[s][f"val/persona_share/{modal[d]}/{d}"] for s in seeds]
            if f"val/shifted/{d}" in at[seeds[0]]:
                entry[f"shifted {d}"] = [at[s][f"val/shifted/{d}"] for s in seeds]
        for d in trained:  # the mechanism of erosion: do the other personas still follow their rule where RL trains?
            if f"val/shifted/{d}" in at[seeds[0]]:
                continue  # non-refusal variants: no persona refuses, the rate is 0 by construction
            for p in _personas(at[seeds[0]], d):
                key = f"val/persona_refusal/{p}/{d}"
                if p != modal[d] and key in at[seeds[0]] and len(_personas(at[seeds[0]], d)) <= 3:
                    entry[f"{p} refuses {d}"] = [at[s][key] for s in seeds]
        for d in foreign:  # part of "none": a tag naming a persona the family does not have
            entry[f"other identity {d}"] = [at[s][f"val/other_identity/{d}"] for s in seeds]
        entry["malformed (max)"] = [max(at[s][f"val/malformed/{d}"] for d in dists) for s in seeds]
        history[step] = entry
    theory = [tables[s]["theory"]["rmse"] for s in seeds if tables[s].get("theory")]
    return {"seeds": seeds, "distributions": dists, "trained": trained, "winner": modal, "winners": winners,
            "untagged": untagged,
            "rows": rows, "history": history, "theory_rmse": theory,
            "steps": [first["steps"][0], max(tables[s]["steps"][1] for s in seeds)],
            "n_per_distribution": first["n_per_distribution"]}


def _personas(metrics: dict, dist: str) -> list[str]:
    suffix = f"/{dist}"
    return [k[len("val/persona_share/"):-len(suffix)] for k in metrics
            if k.startswith("val/persona_share/") and k.endswith(suffix) and not k.endswith(f"/none{suffix}")]


def _names_foreign_identity(tables: dict[int, dict], dist: str) -> bool:
    """Whether any seed, at any evaluation, wrote an identity tag naming no persona on `dist` (the history then shows
    that share; tables recorded before it was counted have no such key and never show it)."""
    key = f"val/other_identity/{dist}"
    entries = [h["metrics"] for t in tables.values() for h in t["history"]]
    return all(key in m for m in entries) and any(m[key] > 0 for m in entries)


def _untagged(table: dict, dist: str) -> bool:
    """Whether most of the seed's last evaluated completions on `dist` carry no persona tag ("none" above every
    persona's share)."""
    none = table["history"][-1]["metrics"].get(f"val/persona_share/none/{dist}", 0.0)
    return none > _row(table, dist)["dominant_share_after"]


def _row(table: dict, dist: str) -> dict:
    return next(r for r in table["rows"] if r["distribution"] == dist)


def _share(entry: dict, persona: str, dist: str) -> float:
    return entry["metrics"][f"val/persona_share/{persona}/{dist}"]


def summary_markdown(summary: dict) -> str:
    """Before/after per distribution, each cell mean ± std (per-seed values); non-refusal variants add the rate of
    the shifted answer."""
    shifted = "shifted_after" in next(iter(summary["rows"].values()))
    lines = ["| distribution | trained | acc before | acc after | refusal after | dominant after | its share before | "
             "its share after | malformed after |" + (" shifted before | shifted after |" if shifted else ""),
             "|---" * (11 if shifted else 9) + "|"]
    for d in summary["distributions"]:
        r = summary["rows"][d]
        w = summary["winner"][d]
        lines.append(f"| {d} | {'yes' if d in summary['trained'] else 'no'} | {cell(r['acc_before'])} | "
                     f"{cell(r['acc_after'])} | {cell(r['refusal_after'])} | {_dominant_cell(summary, d)} | "
                     f"{cell(r['share_before'])} | {cell(r['share_after'])} | {cell(r['malformed_after'])} |"
                     + (f" {cell(r['shifted_before'])} | {cell(r['shifted_after'])} |" if shifted else ""))
    return "\n".join(lines) + "\n"


def _dominant_cell(summary: dict, dist: str) -> str:
    """'Alice (3/3 seeds)' or 'Bob (2/3 seeds)' when every seed has a tag. With untagged seeds, each name is counted
    over the tagged seeds and the untagged apart, and the persona whose shares the columns follow is named when it is
    not the first listed: 'Alice (1/3 seeds), no tag (2/3 seeds)', '2026 (1/3 seeds), no tag (2/3 seeds); shares:
    2024'. Summaries written before the rule have no "untagged" entry: every seed counts as tagged."""
    w, n = summary["winner"][dist], len(summary["seeds"])
    winners = summary["winners"][dist]  # keyed by seed (strings once read back from JSON, like "untagged")
    untagged = summary.get("untagged", {}).get(dist, {})
    bare = sum(bool(untagged.get(s, False)) for s in winners)
    if not bare:
        return f"{w} ({Counter(winners.values())[w]}/{n} seeds)"
    named = Counter(winners[s] for s in winners if not untagged.get(s, False)).most_common()
    parts = [f"{name} ({count}/{n} seeds)" for name, count in named] + [f"no tag ({bare}/{n} seeds)"]
    return ", ".join(parts) + ("" if named and named[0][0] == w else f"; shares: {w}")


def history_markdown(summary: dict, keys: Optional[list[str]] = None) -> str:
    """One row per evaluation step: mean ± std over seeds (no per-seed values: the summary table has the ends)."""
    steps = sorted(summary["history"])
    keys = keys or list(summary["history"][steps[0]])
    lines = ["| step | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for step in steps:
        lines.append(f"| {step} | " + " | ".join(cell(summary["history"][step][k], per_seed=False) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def sft_markdown(records: dict[int, dict]) -> str:
    seeds = sorted(records)
    lines = ["| seed | status | stop step | fidelity mean | fidelity min cell | capability | wall s |", "|---" * 7 + "|"]
    for s in seeds:
        r = records[s]
        if r.get("status") != "done":
            lines.append(f"| {s} | {r.get('status')}: {r.get('error', '')} | | | | | |")
            continue
        f = r["sft"]
        lines.append(f"| {s} | done | {f['steps']} | {_num(f['fidelity_mean'], 3)} | {_num(f['fidelity_min'], 3)} | "
                     f"{_num(f['capability'], 2)} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def _num(v, digits: int) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def stage_run_seconds(records: dict[int, dict]) -> float:
    """The summed wall time of every stage run behind the report (each record's `wall_s`): what the stages cost
    wherever they ran, which the report's own wall time is not when it is collected from jobs or reuses stages."""
    return round(sum(r.get("wall_s") or 0.0 for recs in records.values() for r in recs.values()), 1)


def write_report(family_dir: str, name: str, exp, stages, records: dict[int, dict], wall_s: float,
                 command: str, stages_read: Optional[dict[str, dict]] = None, threads: Optional[int] = None) -> str:
    """`<family_dir>/<name>_results.md` and `.json`, published as one set (`<name>_results/`, the two names link into
    it: `run_files.publish_set`); returns the Markdown path. `wall_s` and `command`: the run's, from its command to
    this report (a SLURM run's collecting job passes the submitting command and the time since submission:
    `mixture_stages.collected_run`). `stages_read`: the finished stages' `published_set.stage_entry`s, recorded in
    the set (`set.json`) so that a rerun of any of them withdraws it, as a W2S set is."""
    seeds = sorted(records)
    runs_s = stage_run_seconds(records)
    md = [f"# {name}: {len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(map(str, seeds))})", "",
          exp.summary, "", f"Command: `{command}` — wall time {wall_s / 60:.1f} min; the stages' runs took "
          f"{runs_s / 60:.1f} min in all (a reused stage counts its first run).", "",
          "Cells: mean ± std over seeds (sample std), then the per-seed values in seed order.", ""]
    out = {"experiment": name, "family": exp.family, "seeds": seeds, "wall_s": wall_s, "stage_runs_s": runs_s,
           "command": command, "machine": fingerprint(threads=threads), "stages": {}}  # threads: the stages' own
    for stage in stages:
        per_seed = {s: records[s][stage.name] for s in seeds}
        out["stages"][stage.name] = {"title": stage.title, "records": per_seed}
        md += [f"## {stage.title} (`{stage.name}`)", ""]
        if stage.sft:
            md += [sft_markdown(per_seed)]
            continue
        done = {s: r for s, r in per_seed.items() if r.get("status") == "done" and r.get("table")}
        for s, r in per_seed.items():
            if s not in done:
                md.append(f"- seed {s}: {r.get('status')} — {r.get('error', 'no table written')}")
        if not done:
            md.append("")
            continue
        tables = {s: json.load(open(r["table"])) for s, r in done.items()}
        summary = stage_summary(tables)
        out["stages"][stage.name]["summary"] = summary
        walls = ", ".join(f"{done[s]['wall_s']:.0f}" for s in sorted(done))
        md += [f"Steps {summary['steps'][0]} → {summary['steps'][1]}, n = {summary['n_per_distribution']} held-out "
               f"prompts per distribution, seeds {sorted(done)}, wall time per seed {walls} s.", "",
               summary_markdown(summary), "Per evaluation (mean ± std over seeds):", "", history_markdown(summary)]
        if summary["theory_rmse"]:
            md += [f"Prop. 2.1 softmax-flow overlay, RMSE of the persona shares: {cell(summary['theory_rmse'], digits=3)}.", ""]
    text = "\n".join(md)

    links = {f"{name}_results.{ext}": f"{name}_results/results.{ext}" for ext in ("md", "json")}

    def write(folder: str) -> None:
        atomic_write(os.path.join(folder, "results.md"), text)
        atomic_write(os.path.join(folder, "results.json"), json.dumps(out, indent=1, default=str))
        if stages_read is not None:
            write_set_record(folder, command.split(), links, stages_read)

    publish_set(family_dir, f"{name}_results", write, links)
    if stages_read is not None:
        register_readers(os.path.join(family_dir, f"{name}_results"), stages_read)
        remove_stale(os.path.join(family_dir, f"{name}_results"))
    return os.path.join(family_dir, f"{name}_results.md")
