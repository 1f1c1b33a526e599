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
from protocols.w2s.figures import correlation_line, drift_ood_correlation, headline_drift_keys, write_figures
from protocols.w2s.teacher_report import (
    WEAK_LABEL_METHODS_EXCLUDED, teacher_label_structure, teacher_label_table, teacher_recipe, teacher_recipe_markdown,
    teacher_structure_markdown,
)


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


