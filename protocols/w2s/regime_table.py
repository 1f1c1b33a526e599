"""The regime table (issue 29): one row per benchmark, from finished W2S protocol runs, saying where weak supervision
amplifies a shortcut and where it only imitates (docs/results.md "Does the fitted teacher carry").

    python -m protocols.w2s.regime_table --run helpful=runs/w2s_small_vocab --run harmless=runs/w2s_small_vocab_harmless ...

Per run (its `results/results.json`): the teacher search's choices per seed, the chosen teachers' structure on the
student half read with the shortcut probe (right where the probe is wrong; errors there / all errors), the
teacher's ID accuracy, naive W2S's WRG and worst AOG (mean [95% t-interval] over seeds, each followed by the
teacher → naive accuracies it is the difference of) and every method's NTS. The last column says which clause of
"naive WRG > 0 with some AOG < 0" holds: by the mean, and whether the 95% interval over seeds excludes 0. A legend
under the table names each column's unit.
"""
from __future__ import annotations

import argparse
import statistics
from typing import Optional

from protocols.engine.published_set import load_published
from protocols.w2s.teacher_search import value_label
from protocols.engine.stats import ci95, mean_std


def load(path: str) -> dict:
    """A run's published results: `path` is its out_dir (its default set, `results/`) or a set folder (a named
    set, e.g. `runs/w2s_small_vocab/results_baselines`); refused when its stages are gone or ran again since."""
    return load_published(path, rerun_hint="rerun its protocol (python -m protocols.w2s --config ...)")


def _mean_std(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    """`w2s_report.mean_std` over the values a run has (None left out); (None, None) when it has none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mean, std, _ = mean_std(values)
    return mean, std


def _cell(values: list[float], interval: bool = False, signed: bool = False) -> str:
    mean, std = _mean_std(values)
    if mean is None:
        return "–"
    text = f"{mean:+.1f}" if signed else f"{mean:.1f}"
    if interval and std is not None:
        low, high = ci95(mean, std, len(values))
        return f"{text} [{low:+.1f}, {high:+.1f}]"
    return text + (f" ± {std:.1f}" if std is not None else "")


def per_seed(results: dict, row: str, column: str) -> list[float]:
    cell = (results["rows"].get(row) or {}).get(column)
    return [] if cell is None else [cell["per_seed"][s] for s in sorted(cell["per_seed"], key=int)]


def _sign(values: list[float], sign: int) -> Optional[str]:
    """None if the mean is not on that side of 0; "interval" if the 95% t-interval excludes 0 too, else "mean"."""
    mean, std = _mean_std(values)
    if mean is None or mean * sign <= 0:
        return None
    interval = ci95(mean, std, len(values)) if std is not None else None
    return "interval" if interval and (interval[0] > 0 if sign > 0 else interval[1] < 0) else "mean"


def accuracies(results: dict, row: str, split: str) -> str:
    """"teacher 18.0 → naive 99.0": the mean accuracies (%) a gain of `row` on `split` is the difference of (the
    teacher's on the row's own pairs, else the teacher row's); "" when the results lack them."""
    student = per_seed(results, row, f"acc/{split}")
    teacher = per_seed(results, row, f"teacher_acc/{split}") or per_seed(results, "teacher", f"acc/{split}")
    if not student or not teacher:
        return ""
    return f"teacher {statistics.fmean(teacher):.1f} → {row} {statistics.fmean(student):.1f}"


def regime_row(name: str, results: dict) -> dict:
    """The row's cells (strings) and the clause flags, from one run's results.json."""
    src, targets = results["id_source"], results["targets"]
    searches = results.get("teacher_search") or {}
    structures = results.get("teacher_structure") or {}
    chosen = ", ".join(value_label(searches[s]["chosen"]) + (f" ×{searches[s]['chosen_budget']} epochs"
                                                             if searches[s].get("chosen_budget", 1) > 1 else "")
                       for s in sorted(searches, key=int)) or "–"
    student = [structures[s]["structure"].get("train_student") for s in sorted(structures, key=int)]
    rule_there = [s["probe_wrong"]["teacher_acc"] for s in student if s]
    errors_there = [s["shortcut_error_share"] for s in student if s]
    base = [s["probe_wrong_share"] for s in student if s]
    strength = [structures[s]["probe"]["shortcut_strength"] for s in structures]
    wrg = per_seed(results, "naive", "wrg")
    aogs = {t: per_seed(results, "naive", f"aog/{t}") for t in targets}
    worst = min(aogs, key=lambda t: statistics.fmean(aogs[t]) if aogs[t] else float("inf"))
    methods = [m for m in results["rows"] if m not in ("teacher", "ceiling")]
    clauses = {"naive WRG > 0": _sign(wrg, +1), "some AOG < 0": _sign(aogs[worst], -1)}
    return {"benchmark": name, "seeds": len(results["seeds"]), "chosen": chosen,
            "strength": _cell(strength), "rule_there": _cell(rule_there), "errors_there": _cell(errors_there),
            "base": _cell(base), "teacher_id": _cell(per_seed(results, "teacher", f"acc/{src}")),
            "wrg": _cell(wrg, interval=True, signed=True) + _parenthesised(accuracies(results, "naive", src)),
            "worst_aog": f"{_cell(aogs[worst], interval=True, signed=True)} "
                         f"({worst}{': ' + acc if (acc := accuracies(results, 'naive', worst)) else ''})",
            "nts": {m: _cell(per_seed(results, m, "nts"), signed=True) for m in methods}, "clauses": clauses}


def _parenthesised(text: str) -> str:
    return f" ({text})" if text else ""


LEGEND = """Legend (accuracies and shares in %, gains in percent points; mean over seeds, ± std or [95% t-interval]):
- shortcut strength: the shortcut probe's accuracy on the ID validation split (the probe is fitted on the teacher
  half; docs/teacher_structure.md).
- teacher right where the probe is wrong: the chosen teacher's accuracy on the student-half pairs the probe gets
  wrong; its errors there / share of such pairs: the share of the teacher's errors on those pairs, beside the share
  of such pairs.
- teacher ID acc: the teacher's accuracy on the ID test split.
- naive WRG: naive W2S's ID accuracy − the teacher's, then (teacher → naive) the two accuracies.
- naive worst AOG: naive's OOD accuracy − the teacher's on the target where that gain is lowest, then (target:
  teacher → naive) the two accuracies.
- NTS <method>: the method's mean AOG − max(0, the teacher's ID acc − the method's ID acc).
- regime: which clause of "naive WRG > 0 with some AOG < 0" holds, by the mean and by the interval."""


def markdown(rows: list[dict]) -> str:
    methods = list(dict.fromkeys(m for r in rows for m in r["nts"]))
    head = ["benchmark", "seeds", "teacher search: chosen per seed", "shortcut strength",
            "teacher right where the probe is wrong, student half", "its errors there / share of such pairs",
            "teacher ID acc", "naive WRG", "naive worst AOG", *[f"NTS {m}" for m in methods], "regime"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c = r["clauses"]
        said = {None: "no", "mean": "yes (mean; its interval includes 0)", "interval": "yes (interval excludes 0)"}
        regime = "; ".join(f"{k}: {said[v]}" for k, v in c.items())
        if all(c.values()):
            regime = "amplifies the shortcut — " + regime
        cells = [r["benchmark"], str(r["seeds"]), r["chosen"], r["strength"], r["rule_there"],
                 f"{r['errors_there']} / {r['base']}", r["teacher_id"], r["wrg"], r["worst_aog"],
                 *[r["nts"].get(m, "–") for m in methods], regime]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + LEGEND


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=OUT_DIR",
                        help="a benchmark's name and its protocol out_dir, or a named set's folder (repeat)")
    args = parser.parse_args(argv)
    runs = []
    for spec in args.run:
        name, sep, out_dir = spec.partition("=")
        if not sep or not name or not out_dir:
            parser.error(f"--run takes NAME=OUT_DIR, got {spec!r}")
        runs.append((name, out_dir))
    names = [name for name, _ in runs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # two rows of one name could not be told apart in the table
        parser.error(f"--run names {repeated} more than once: give each benchmark its own name")
    rows = [regime_row(name, load(out_dir)) for name, out_dir in runs]
    text = markdown(rows)
    print(text)
    return text


if __name__ == "__main__":
    from protocols.engine.refusals import run_main

    run_main(main)
