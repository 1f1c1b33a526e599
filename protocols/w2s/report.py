"""Tables and figures of a W2S protocol run: rows = methods, columns = ID accuracy, WRG, OOD accuracy and AOG per
target, mean OOD accuracy and mean AOG, NTS, PGR (accuracies in %, gains in percent points, PGR a ratio; mean ± std
over seeds, the value alone for one seed), as in the paper's tables, with a legend under each table; plus
TensorBoard figures. `summarize` computes (every rank of a DDP run gets the same results); `write_reports`
writes and prints (global rank 0 only), each file replaced in one step."""
from __future__ import annotations

import csv
import io
import math
import os
import statistics
from typing import Any, Optional

from datamodules.atomic_files import atomic_write, atomic_write_json
from protocols.engine.stats import ci95, mean_std, percent  # noqa: F401 -- used here and by its readers


OOD_ACC_MEAN = "acc_ood_mean"  # the mean over OOD targets of a row's accuracy (not "acc/...": no split of that name)


def row_scores(stage: dict, id_source: str, is_teacher: bool) -> dict[str, float]:
    """One stage's accuracies (%) and gains (percent points; the teacher's own row has zero gains by definition)."""
    test = stage["test"]
    if is_teacher:
        scores = {"acc/" + k: 100.0 * v["acc"] for k, v in test.items() if k != "transfer"}
        targets = [k for k in scores if k != "acc/" + id_source]
        scores.update({"wrg": 0.0, "aog_mean": 0.0, "nts": 0.0, **{"aog/" + t[4:]: 0.0 for t in targets}})
        if targets:
            scores[OOD_ACC_MEAN] = statistics.fmean(scores[t] for t in targets)
        return scores
    tr = test["transfer"]
    scores = {"acc/" + k: v for k, v in tr["acc_student"].items()}
    scores.update({"teacher_acc/" + k: v for k, v in tr["acc_teacher"].items()})
    scores.update({"wrg": tr["wrg"], "aog_mean": tr["aog_mean"], "nts": tr["nts"]})
    scores.update({"aog/" + t: v for t, v in tr["aog"].items()})
    if tr["aog"]:  # the same targets as AOG's, so mean AOG = this mean − the teacher's on the same pairs
        scores[OOD_ACC_MEAN] = statistics.fmean(tr["acc_student"][t] for t in tr["aog"])
    if "pgr" in tr:
        scores["pgr"] = tr["pgr"]
    for key, value in flatten_drift(stage.get("drift") or {}).items():
        scores["drift/" + key] = value
    return scores


def flatten_drift(drift: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in drift.items():
        if isinstance(v, dict):
            out.update(flatten_drift(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)):
            out[f"{prefix}{k}"] = float(v)
    return out


def aggregate(raw: dict[str, dict[int, dict]], id_source: str) -> dict[str, dict[str, dict[str, Any]]]:
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for method, per_seed in raw.items():
        scores = {seed: row_scores(stage, id_source, method == "teacher") for seed, stage in per_seed.items()}
        keys = sorted({k for s in scores.values() for k in s})
        table[method] = {}
        for key in keys:
            values = {seed: s[key] for seed, s in scores.items() if key in s}
            m, sd, n = mean_std(list(values.values()))
            table[method][key] = {"mean": m, "std": sd, "n": n, "ci95": ci95(m, sd, n), "per_seed": values}
    return table


def display_columns(id_source: str, targets: list[str], has_pgr: bool, drift_keys: list[str]) -> list[tuple[str, str]]:
    """(key, header) of the table: each gain beside the accuracy it is a difference of (ID acc beside WRG, OOD acc
    beside AOG per target, their means), then NTS, PGR and the drift. The gains' headers are those of the tables
    published before the accuracies were added (tests/test_w2s_slow.py matches cells by header)."""
    cols = [(f"acc/{id_source}", "ID acc"), ("wrg", "WRG")]
    for t in targets:
        cols += [(f"acc/{t}", f"OOD acc {t}"), (f"aog/{t}", f"AOG {t}")]
    if len(targets) > 1:  # with one target its mean is the same column again
        cols.append((OOD_ACC_MEAN, "mean OOD acc"))
    cols += [("aog_mean", "mean AOG"), ("nts", "NTS")]
    if has_pgr:
        cols.append(("pgr", "PGR"))
    cols += [(k, f"OOD drift {k.split('/')[2]} ({k.split('/')[3]})") for k in drift_keys]
    return cols


def headline_drift_keys(table: dict) -> list[str]:
    """The OOD-mean drift at the deepest measured layer: MSE and CKA (the results-table columns)."""
    keys = {k for row in table.values() for k in row if k.startswith("drift/ood_mean/")}
    if not keys:
        return []
    deepest = max(int(k.rsplit("layer", 1)[1]) for k in keys)
    return [k for k in (f"drift/ood_mean/mse/layer{deepest}", f"drift/ood_mean/cka/layer{deepest}") if k in keys]


def fmt(cell: dict | None, key: str) -> str:
    """'mean ± std' over seeds; the value alone when one seed gave it."""
    if cell is None or math.isnan(cell["mean"]):
        return "–"
    spread = cell["std"] is not None
    if key == "pgr" or key.startswith("drift/"):
        return f"{cell['mean']:.3g}" + (f" ± {cell['std']:.2g}" if spread else "")
    sign = "+" if not key.startswith("acc") and cell["mean"] >= 0 else ""  # accuracies unsigned, gains signed
    return f"{sign}{cell['mean']:.1f}" + (f" ± {cell['std']:.1f}" if spread else "")


def summarize(p, stages_raw: dict[str, dict[int, dict]]) -> dict:
    """results.json's content: the table (rows = methods, a swept method's row picked per seed by `id_val`), the
    `oracle_target` table beside it, the paired differences to ANCHOR, and what they need to be read."""
    from protocols.w2s.budget import budget, budget_markdown, same_step, same_step_markdown
    from protocols.engine.machine import fingerprint
    from protocols.w2s.model_selection import (
        available, paired, paired_markdown, select, selection_markdown, selection_record,
    )
    from protocols.w2s.multi_teacher import multi_teacher_markdown, multi_teacher_record, without_extra_teachers

    first = next(iter(stages_raw["teacher"].values()))["test"]
    splits = [k for k in first if k != "transfer"]
    id_source, targets = splits[0], splits[1:]
    teachers = multi_teacher_record(p, stages_raw, id_source, targets)  # extra teachers: no rows of the table
    stages_raw = without_extra_teachers(p, stages_raw)
    raw, _ = select(p, stages_raw, "id_val", targets)
    table = aggregate(raw, id_source)
    selection = selection_record(p, stages_raw, targets)
    oracle = aggregate(select(p, stages_raw, "oracle_target", targets)[0], id_source) if selection and targets else {}
    reference = getattr(p, "paired_reference", None)
    references = reference if isinstance(reference, list) else [reference] if reference else []
    by_reference = {r: d for r in references if (d := paired(table, r))}
    pairs = by_reference.get(references[0], {}) if references else {}
    has_pgr = any("pgr" in row for row in table.values())
    cols = display_columns(id_source, targets, has_pgr, headline_drift_keys(table))
    teacher_labels = teacher_label_structure(raw)
    searches, structures = teacher_recipe(raw)
    correlation = drift_ood_correlation(table, targets)
    costs = budget(p, stages_raw)
    missing = available(stages_raw, p, "weak_val")
    weak = {} if missing else aggregate(select(p, stages_raw, "weak_val", targets)[0], id_source)
    weak_by_reference = {r: d for r in references if (d := paired(weak, r))}
    steps = same_step(p, stages_raw)
    oracle_part = ("Oracle selection (`oracle_target`: each swept method's value picked on the target **test** splits; "
                   "an upper bound, not a result):\n\n" + markdown_table(oracle, cols, len(p.seeds), short_legend(cols))
                   ) if oracle else ""
    full_legend = "\n".join(line for line in (legend(cols, id_source, len(p.seeds), worked_example(table, targets)),
                                              teacher_differences_line(table, id_source, targets)) if line)
    markdown = "\n\n".join(part for part in (
        WHAT_TO_LOOK_FOR, teacher_recipe_markdown(searches), outside_models_line(p),
        selection_markdown(selection, "id_val"), markdown_table(table, cols, len(p.seeds), full_legend),
        interval_table(table, targets) if len(p.seeds) > 1 else "",
        *(paired_markdown(d, r) for r, d in by_reference.items()),
        budget_markdown(costs, list(table)),
        multi_teacher_markdown(teachers),
        weak_val_markdown(weak, weak_by_reference, selection, missing, cols, len(p.seeds), same_rows(weak, table)),
        same_step_markdown(steps),
        teacher_structure_markdown(structures),
        oracle_part, selection_markdown(selection, "oracle_target") if oracle else "",
        teacher_label_table(teacher_labels), correlation_line(correlation)) if part)
    return {"id_source": id_source, "targets": targets, "seeds": list(p.seeds), "units": column_units(cols),
            "columns": [c for c, _ in cols], "column_names": [name for _, name in cols], "rows": table,
            "selection": {"rule": "id_val", "swept": selection}, "oracle_rows": oracle, "paired": pairs,
            "paired_reference": references[0] if pairs else None, "paired_by_reference": by_reference,
            "weak_val_rows": weak, "weak_val_paired_by_reference": weak_by_reference,
            "weak_val_same_as_id_val": bool(weak) and same_rows(weak, table),
            "weak_val_missing": missing, "budget": costs, "same_step": steps,
            "teacher_labels": teacher_labels, "teacher_search": searches, "teacher_structure": structures,
            "drift_ood_correlation": correlation, "markdown": markdown,
            "wall_seconds": {m: sum(s.get("fit_seconds", 0.0) for s in per.values()) for m, per in stages_raw.items()},
            "method_seconds": method_seconds(p, stages_raw), **({"multi_teacher": teachers} if teachers else {}),
            "machine": fingerprint()}  # which machine must reproduce this table cell for cell (issue 50)


WEAK_VAL_RULE = ("the strict weak-to-strong reading: every swept value and stopping point chosen by agreement with the "
                 "teacher's labels on the ID validation split; no gold label, no target data")


def same_rows(a: dict, b: dict) -> bool:
    """Two aggregated tables hold the same rows, in the same order, with the same per-seed value in every cell."""
    if list(a) != list(b):
        return False
    for method, row in a.items():
        other = b[method]
        if set(row) != set(other):
            return False
        for key, cell in row.items():
            x, y = cell["per_seed"], other[key]["per_seed"]
            if set(x) != set(y) or any(not _same_value(x[s], y[s]) for s in x):
                return False
    return True


def _same_value(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=0.0, abs_tol=1e-9)


def weak_val_markdown(weak: dict, by_reference: dict, selection: dict, missing: list[str], cols, n_seeds: int,
                      same: bool = False) -> str:
    """The table under the strict weak-to-strong rule, `weak_val`, with its picks and paired differences; or why it
    is absent; or, when it is the `id_val` table cell for cell (`same`: nothing chosen on validation data, or both
    rules picked alike), one line saying so instead of the table printed twice."""
    from protocols.w2s.model_selection import paired_markdown, selection_markdown

    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        return (f"No `weak_val` table: {len(missing)} stage(s) finished before the teacher's validation labels were "
                f"recorded ({shown}); rerun them with --force to read the run under that rule.")
    if not weak:
        return ""
    if same:  # worded so that no line starts "Selection `weak_val`": that heading announces a table below it
        why = ("both rules picked the same values" if selection else
               "no row is chosen on validation data: nothing is swept and nothing stops early")
        return "\n\n".join(part for part in (
            f"Under `weak_val` ({WEAK_VAL_RULE}) the table is the `id_val` table above, cell for cell ({why}); it "
            "is not printed again.", selection_markdown(selection, "weak_val")) if part)
    head = f"Selection `weak_val` ({WEAK_VAL_RULE}). Rows nested on another method's `id_val` pick are left out:"
    return "\n\n".join(part for part in (
        head, selection_markdown(selection, "weak_val"), markdown_table(weak, cols, n_seeds, short_legend(cols)),
        *(paired_markdown(d, r).replace("Paired differences", "Under `weak_val`, paired differences", 1)
          for r, d in by_reference.items())) if part)


def method_seconds(p, stages_raw: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """Per method, over seeds: its fits, their mean wall time and the total (a sweep costs all its fits; a method
    that only evaluates another's checkpoints costs its validate + test runs)."""
    from protocols.w2s.model_selection import method_stages

    out = {}
    for method, stages in method_stages(p).items():
        results = [stages_raw[name][seed] for name, _ in stages for seed in stages_raw.get(name, {})]
        fits = [r.get("fit_seconds", 0.0) for r in results if r.get("fit_seconds")]
        evals = [r.get("test_seconds", 0.0) for r in results if r.get("test_seconds")]
        out[method] = {"stages": len(results), "fit_seconds_mean": statistics.fmean(fits) if fits else 0.0,
                       "fit_seconds_total": sum(fits), "eval_seconds_total": sum(evals),
                       "seeds": len({seed for name, _ in stages for seed in stages_raw.get(name, {})})}
    return out


WHAT_TO_LOOK_FOR = ("What to look for: the paper's failure is a weak-label student with WRG > 0 (it beats its teacher "
                    "in-distribution) and some AOG < 0 (it falls below the teacher out of distribution); ANCHOR "
                    "should keep the WRG and lift the NTS.")
WEAK_LABEL_METHODS_EXCLUDED = ("teacher", "ceiling")


def outside_models_line(p) -> str:
    """Which rows are outside models tested as is (`teacher_pretrained`, `zero_shot`): their rows come from
    `cli.py test` alone, scored like the others (the teacher's gains 0, the zero-shot rows' against the teacher)."""
    from protocols.w2s.config import zero_shot_name

    parts = []
    if getattr(p, "teacher_pretrained", None):
        parts.append(f"the teacher is the outside reward model `{p.teacher_pretrained}`, tested as is (not trained "
                     "here); the students learn from its labels")
    for spec in getattr(p, "zero_shot", None) or []:
        parts.append(f"`{zero_shot_name(spec)}` is `{spec}`, tested zero-shot (no training): its WRG / AOG / NTS "
                     "are against the teacher on the same pairs")
    return ("Outside models: " + "; ".join(parts) + ".") if parts else ""


def teacher_recipe(raw: dict[str, dict[int, dict]]) -> tuple[dict[int, dict], dict[int, dict]]:
    """Per seed, the teacher search's record (`protocols.w2s.teacher_search`) and the chosen teacher's structure read
    with the shortcut probe (`protocols.w2s.shortcut_probe.measure`); empty when the teacher was fitted once."""
    searches, structures = {}, {}
    for seed, stage in sorted((raw.get("teacher") or {}).items()):
        if "teacher_search" in stage:
            searches[seed] = stage["teacher_search"]
        if "teacher_structure" in stage:
            structures[seed] = stage["teacher_structure"]
    return searches, structures


def teacher_recipe_markdown(searches: dict[int, dict]) -> str:
    """What the teacher search chose per seed and why (above the table: a list, so the table stays the first)."""
    from protocols.w2s.teacher_search import search_markdown

    if not searches:
        return ""
    return "\n".join(["The weak teacher's recipe, searched per seed on the validation split "
                      "(`protocols.w2s.teacher_search`; docs/teacher_structure.md):", search_markdown(searches)])


def teacher_structure_markdown(structures: dict[int, dict]) -> str:
    """The chosen teacher's structure per seed and split (below the table)."""
    lines: list[str] = []
    if structures:
        lines += ["The chosen teacher's structure (shortcut probe fitted on the teacher half; test splits "
                  "reported, never searched on): accuracy on the pairs where the probe is wrong, and the share "
                  "of its errors that are there (beside the share of such pairs).", "",
                  "| seed | split | teacher acc | right where the probe is wrong (pairs) | errors there / all errors "
                  "| probe-wrong share of pairs |", "|---|---|---|---|---|---|"]
        for seed, m in sorted(structures.items()):
            for split, st in m["structure"].items():
                lines.append(f"| {seed} | {split} | {percent(st['teacher_acc'])} | "
                             f"{percent(st['probe_wrong']['teacher_acc'])} ({st['probe_wrong']['pairs']}) | "
                             f"{percent(st['shortcut_error_share'])} ({st['shortcut_errors']}/{st['teacher_errors']}) | "
                             f"{percent(st['probe_wrong_share'])} |")
    return "\n".join(lines)


def teacher_label_structure(raw: dict[str, dict[int, dict]]) -> dict[int, dict]:
    """Per seed, the teacher's error structure on the student half (`datamodules.preference.label_diagnostics`),
    as the first weak-label stage of that seed recorded it."""
    out: dict[int, dict] = {}
    for method, per_seed in raw.items():
        if method in WEAK_LABEL_METHODS_EXCLUDED:
            continue
        for seed, stage in per_seed.items():
            if "teacher_labels" in stage and seed not in out:
                out[seed] = stage["teacher_labels"]
    return dict(sorted(out.items()))


def teacher_label_table(structure: dict[int, dict]) -> str:
    if not structure:
        return ""
    cols = [("error_rate", "error rate"), ("errors_with_artifact_on_rejected", "errors with the artifact on rejected"),
            ("error_rate_artifact_on_rejected", "error rate, artifact on rejected"),
            ("error_rate_artifact_on_chosen", "error rate, artifact on chosen"),
            ("agreement_with_artifact", "labels agree with the artifact"),
            ("confidence_when_wrong", "confidence when wrong"), ("confidence_when_right", "confidence when right")]
    cols = [(k, name) for k, name in cols if any(k in d for d in structure.values())]
    lines = ["The teacher's labels on the student half (shares; confidence = max(P, 1 − P)):", "",
             "| seed | " + " | ".join(name for _, name in cols) + " |", "|---|" + "---|" * len(cols)]
    for seed, d in structure.items():
        lines.append(f"| {seed} | " + " | ".join(f"{d[k]:.3f}" if k in d else "–" for k, _ in cols) + " |")
    return "\n".join(lines)


def interval_table(table: dict, targets: list[str]) -> str:
    """WRG, every AOG and NTS as mean [95% t-interval] with the per-seed values (the claims' evidence)."""
    keys = [("wrg", "WRG"), *[(f"aog/{t}", f"AOG {t}") for t in targets], ("nts", "NTS")]
    lines = ["Mean [95% t-interval over seeds] in percent points; per-seed values in seed order:", "",
             "| method | " + " | ".join(name for _, name in keys) + " |", "|---|" + "---|" * len(keys)]
    for method, row in table.items():
        if method == "teacher":
            continue
        cells = []
        for key, _ in keys:
            cell = row.get(key)
            if cell is None:
                cells.append("–")
                continue
            interval = f" [{cell['ci95'][0]:+.1f}, {cell['ci95'][1]:+.1f}]" if cell.get("ci95") else ""
            seeds = ", ".join(f"{v:+.1f}" for _, v in sorted(cell["per_seed"].items()))
            cells.append(f"{cell['mean']:+.1f}{interval} ({seeds})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pearson(xs: list[float], ys: list[float]) -> Optional[float]:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def drift_ood_correlation(table: dict, targets: list[str]) -> Optional[dict]:
    """Pearson r between the headline OOD drift (MSE at the deepest layer) and mean OOD accuracy over the weak-label
    students: per seed (across methods) and pooled over every (method, seed) point. The gold ceiling is left out:
    it learns from other labels, so its drift answers another question."""
    keys = headline_drift_keys(table)
    if not keys:
        return None
    key = keys[0]
    methods = [m for m in table if m not in WEAK_LABEL_METHODS_EXCLUDED and key in table[m]]
    points: dict[int, list[tuple[float, float]]] = {}
    for m in methods:
        for seed, drift, ood in drift_points(table[m], targets, key):
            points.setdefault(seed, []).append((drift, ood))
    per_seed = {seed: _pearson([d for d, _ in pts], [a for _, a in pts]) for seed, pts in sorted(points.items())}
    pooled = [pt for pts in points.values() for pt in pts]
    return {"drift_key": key, "methods": methods, "per_seed": per_seed,
            "pooled": _pearson([d for d, _ in pooled], [a for _, a in pooled]), "points": len(pooled)}


def drift_points(row: dict, targets: list[str], drift_key: str) -> list[tuple[int, float, float]]:
    """(seed, drift, mean OOD accuracy) for every seed of one method's row that has both."""
    out = []
    for seed, drift in sorted(row[drift_key]["per_seed"].items()):
        accs = [row[f"acc/{t}"]["per_seed"].get(seed) for t in targets]
        if all(a is not None for a in accs):
            out.append((seed, drift, statistics.fmean(accs)))
    return out


def correlation_line(c: Optional[dict]) -> str:
    if not c:
        return ""
    show = lambda r: "–" if r is None else f"{r:+.2f}"
    seeds = ", ".join(f"seed {s}: {show(r)}" for s, r in c["per_seed"].items())
    return (f"Drift ({c['drift_key'].replace('drift/', '')}) vs mean OOD accuracy over the weak-label students "
            f"({', '.join(c['methods'])}): Pearson r pooled over {c['points']} points {show(c['pooled'])}; "
            f"per seed {seeds}. Negative = more drift goes with lower OOD accuracy.")


# The protocol's outputs form one set, `<out_dir>/results/` (`run_files.publish_set`); these stable names in out_dir
# point into it. TensorBoard's folders (results/summary, results/hparams) get no link: it would list them twice.
RESULTS_DIR = "results"
RESULT_LINKS = {name: f"{RESULTS_DIR}/{name}" for name in
                ("protocol.json", "results.json", "results.csv", "results.md", "figures")}


def result_links(results_name: str) -> dict[str, str]:
    """The stable names of a set: the default set's documented ones, or `<name>.md|json|csv` for a named one."""
    if results_name == RESULTS_DIR:
        return RESULT_LINKS
    return {f"{results_name}.{ext}": f"{results_name}/results.{ext}" for ext in ("md", "json", "csv")}


def write_reports(out_dir: str, results: dict) -> None:
    """results.json / .csv / .md and the figures into `out_dir` (the set being published); global rank 0 only."""
    atomic_write_json(results, os.path.join(out_dir, "results.json"))
    cols = results["columns"]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["method"] + [f"{c}_{s}" for c in cols for s in ("mean", "std")])
    for method, row in results["rows"].items():
        writer.writerow([method] + [_csv_cell(row.get(c), s) for c in cols for s in ("mean", "std")])
    atomic_write(os.path.join(out_dir, "results.csv"), buf.getvalue())
    atomic_write(os.path.join(out_dir, "results.md"), results["markdown"] + "\n")
    write_figures(out_dir, results["rows"], results["targets"])


def _csv_cell(cell: Optional[dict], stat: str) -> str:
    return "" if cell is None or cell[stat] is None else f"{cell[stat]:.4f}"


def markdown_table(table: dict, cols: list[tuple[str, str]], n_seeds: int, legend_text: str = "") -> str:
    """A caption naming each kind of column's unit, the table, and `legend_text` under it."""
    keys = [c for c, _ in cols]
    spread = "1 seed" if n_seeds == 1 else f"mean ± std over {n_seeds} seeds"
    units = ["accuracies (ID acc, OOD acc) in %", "gains (WRG, AOG, NTS) in percent points"]
    if "pgr" in keys:
        units.append("PGR a ratio")
    if any(c.startswith("drift/") for c in keys):
        units.append("drift in its own units")
    lines = [f"{spread[0].upper()}{spread[1:]}; " + ", ".join(units) + ". Teacher and student scored on the same pairs.",
             "", "| method | " + " | ".join(name for _, name in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for method, row in table.items():
        lines.append(f"| {method} | " + " | ".join(fmt(row.get(c), c) for c, _ in cols) + " |")
    return "\n".join(lines) + (f"\n\n{legend_text}" if legend_text else "")


def short_legend(cols: list[tuple[str, str]]) -> str:
    """The one-line legend of the later tables of the same columns (`weak_val`, oracle)."""
    pgr = ", PGR a ratio" if any(c == "pgr" for c, _ in cols) else ""
    return ("Columns and units as in the legend under the first table: accuracies in %, WRG / AOG / NTS in percent "
            f"points against the teacher row{pgr}.")


def legend(cols: list[tuple[str, str]], id_source: str, n_seeds: int, example: str = "") -> str:
    """The words under the table: each column kind present, what it is and its unit (definitions:
    `lightning_modules.reward.metrics.transfer_scores`); `example`: a gain of the table worked out (`worked_example`)."""
    keys = [c for c, _ in cols]
    lines = [f"Legend (ID = the source's test split `{id_source}`; each gain is the row's accuracy minus the teacher's "
             f"on the same pairs{'; ' + example if example else ''}):",
             "- ID acc, OOD acc <target> (%): pairwise accuracy, the share of test pairs whose chosen response the "
             "model scores above the rejected one" + ("; mean OOD acc: its mean over the targets."
                                                     if OOD_ACC_MEAN in keys else "."),
             "- WRG, weak-to-strong gain (percent points): the row's ID acc − the teacher's ID acc.",
             "- AOG <target>, absolute OOD gain (percent points): the row's OOD acc on that target − the teacher's; "
             "mean AOG: its mean over the targets.",
             "- NTS, net transfer score (percent points): mean AOG − max(0, teacher's ID acc − the row's ID acc), "
             "the OOD gain less any loss in distribution."]
    if "pgr" in keys:
        lines.append("- PGR, performance gap recovered (a ratio, not points): WRG / (the ceiling's ID acc − the "
                     "teacher's ID acc); 0 = no better than the teacher, 1 = as good as the gold ceiling; – on the "
                     "teacher and ceiling rows.")
    if any(c.startswith("drift/") for c in keys):
        lines.append("- OOD drift mse / cka (layer k): how far the row's hidden states at layer k moved from its "
                     "initial weights' on the OOD test pairs, mean over the targets: mse a mean squared distance in "
                     "the hidden states' units (0 = unmoved), cka a linear CKA similarity (1 = unmoved); "
                     "docs/drift.md.")
    if n_seeds > 1:
        lines.append("- Cells: mean ± std over seeds of the per-seed values (a gain is computed in each seed, then "
                     "averaged).")
    return "\n".join(lines)


def worked_example(table: dict, targets: list[str]) -> str:
    """The table's largest AOG of a weak-label row (else of the ceiling) as the difference it is: "naive on T: OOD
    acc 99.0 − the teacher's 18.0 = AOG +81.0"."""
    for rows in ([m for m in table if m not in WEAK_LABEL_METHODS_EXCLUDED], [m for m in table if m == "ceiling"]):
        found = []
        for method in rows:
            for t in targets:
                cells = [table[method].get(k) for k in (f"acc/{t}", f"teacher_acc/{t}", f"aog/{t}")]
                if all(c is not None and not math.isnan(c["mean"]) for c in cells):
                    found.append((abs(cells[2]["mean"]), method, t, *(c["mean"] for c in cells)))
        if found:
            _, method, t, acc, teacher, aog = max(found, key=lambda f: f[0])  # ties: the first row and target
            return f"e.g. {method} on {t}: OOD acc {acc:.1f} − the teacher's {teacher:.1f} = AOG {aog:+.1f}"
    return ""


def teacher_differences_line(table: dict, id_source: str, targets: list[str], tol: float = 0.05) -> str:
    """The rows whose gains are against a teacher accuracy other than the teacher row's (its pairs or its seeds
    differ): a reader subtracting the teacher row's accuracy would get another number, so they are named."""
    teacher = table.get("teacher") or {}
    found = []
    for method, row in table.items():
        for split in [id_source, *targets]:
            own, ref = row.get(f"teacher_acc/{split}"), teacher.get(f"acc/{split}")
            if own and ref and abs(own["mean"] - ref["mean"]) > tol:
                found.append(f"{method} on {split}: {own['mean']:.1f} (teacher row {ref['mean']:.1f})")
    if not found:
        return ""
    return ("- The teacher scored differently on these rows' pairs or seeds than in its own row, and their gains are "
            "against the former (results.json: `teacher_acc/<split>`): " + "; ".join(found) + ".")


def column_units(cols: list[tuple[str, str]]) -> dict[str, str]:
    """results.json's `units`: each column's unit."""
    def unit(key: str) -> str:
        if key.startswith("acc"):
            return "percent"
        if key == "pgr":
            return "ratio"
        if key.startswith("drift/"):
            return "mean squared distance" if "/mse/" in key else "CKA similarity" if "/cka/" in key else "drift"
        return "percent points"
    return {key: unit(key) for key, _ in cols}


def _mean(row: dict, key: str) -> float:
    return (row.get(key) or {"mean": float("nan")})["mean"]


def write_figures(out_dir: str, table: dict, targets: list[str]) -> None:
    """AOG heatmap (method × target, each cell with the accuracies it is the difference of), NTS bars, and drift vs
    mean OOD accuracy, to TensorBoard and PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from torch.utils.tensorboard import SummaryWriter

    methods = [m for m in table if m != "teacher"]
    if not methods:
        return
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    writer = SummaryWriter(os.path.join(out_dir, "summary"))
    figures = {}

    figures["aog_heatmap"] = aog_heatmap(plt, table, methods, targets)

    fig, ax = plt.subplots(figsize=(max(4.0, 1.5 + 0.8 * len(methods)), 3.6))
    means = [table[m]["nts"]["mean"] for m in methods]
    stds = [table[m]["nts"]["std"] or 0.0 for m in methods]  # one seed: no error bar
    ax.bar(range(len(methods)), means, yerr=stds, color=["tab:green" if v >= 0 else "tab:red" for v in means])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(methods)), methods, rotation=20, ha="right")
    ax.set_xlabel("method")
    ax.set_ylabel("NTS (percent points)")
    spread = "" if all(table[m]["nts"]["std"] is None for m in methods) else "\n(error bars: std over seeds)"
    ax.set_title(f"Net transfer score: mean AOG − any ID loss\nagainst the teacher{spread}", fontsize=9)
    fig.tight_layout()
    figures["nts_bars"] = fig

    drift_keys = headline_drift_keys(table)
    if drift_keys:
        figures["drift_vs_ood"] = drift_figure(plt, table, targets, drift_keys[0])

    for name, fig in figures.items():
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=120)
        atomic_write(os.path.join(fig_dir, f"{name}.png"), png.getvalue())
        writer.add_figure(f"w2s/{name}", fig)
        plt.close(fig)
    writer.close()


def aog_heatmap(plt, table: dict, methods: list[str], targets: list[str]):
    """AOG per method and target (colour), each cell annotated with the gain and the teacher → row OOD accuracies
    it is the difference of (the row's own teacher accuracy on its pairs; the teacher row's when it has none)."""
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(targets), 1.2 + 0.55 * len(methods)))
    grid = [[_mean(table[m], f"aog/{t}") for t in targets] for m in methods]
    lim = max([abs(v) for row in grid for v in row if not math.isnan(v)] + [1.0])
    im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xticks(range(len(targets)), targets, rotation=20, ha="right")
    ax.set_yticks(range(len(methods)), methods)
    teacher = table.get("teacher") or {}
    for i, m in enumerate(methods):
        for j, t in enumerate(targets):
            before = table[m].get(f"teacher_acc/{t}") or teacher.get(f"acc/{t}") or {"mean": float("nan")}
            dark = abs(grid[i][j]) > 0.6 * lim  # the colour map's ends: white text stays readable there
            ax.text(j, i, f"{grid[i][j]:+.1f}\n{before['mean']:.0f}% → {_mean(table[m], f'acc/{t}'):.0f}%",
                    ha="center", va="center", fontsize=7, color="white" if dark else "black")
    fig.colorbar(im, ax=ax, label="AOG (percent points)")
    ax.set_xlabel("OOD target")
    ax.set_ylabel("method")
    ax.set_title("AOG: the row's OOD accuracy − the teacher's\n(cell: AOG, then teacher → row accuracy)", fontsize=9)
    fig.tight_layout()
    return fig


def drift_figure(plt, table: dict, targets: list[str], drift_key: str):
    """Left: every weak-label student, one point per seed (the correlation's data). Right: the gold ceiling, whose
    drift comes from other labels, on its own panel so it does not set the left panel's trend."""
    fig, (ax, ax_gold) = plt.subplots(1, 2, figsize=(7.5, 3.5), gridspec_kw={"width_ratios": [3, 1]})
    for m in table:
        if m == "teacher" or drift_key not in table[m]:
            continue
        points = drift_points(table[m], targets, drift_key)
        (ax_gold if m == "ceiling" else ax).scatter([d for _, d, _ in points], [a for _, _, a in points], label=m, s=18)
    label = drift_label(drift_key)
    ax.set_xlabel(label, fontsize=8)
    ax.set_ylabel("mean OOD accuracy (%)")
    ax.set_title("Weak-label students (one point per seed)", fontsize=9)
    ax.legend(fontsize=7)
    ax_gold.set_title("Gold ceiling", fontsize=9)
    ax_gold.set_xlabel("the same drift measure", fontsize=8)
    fig.tight_layout()
    return fig


def drift_label(drift_key: str) -> str:
    """An axis label for a drift key `drift/ood_mean/<measure>/layer<k>`."""
    parts = drift_key.split("/")
    measure, layer = (parts[2], parts[3]) if len(parts) == 4 else (drift_key, "")
    what = {"mse": "mean squared distance to the initial weights", "cka": "CKA similarity to the initial weights",
            "cosine": "cosine to the initial weights"}.get(measure, measure)
    return f"OOD drift: {what}, hidden layer {layer.replace('layer', '')} (mean over targets)"
