"""ID accuracy and NTS against ANCHOR's λ, from a finished protocol run (issue 10's ablation; docs/results.md):

    python -m protocols.w2s.lambda_curve --out_dir runs/w2s_small_vocab --out_dir runs/w2s_small_vocab_ablations

Reads `<out_dir>/results.json` and `protocol.json` of each run (runs of the same teacher and data: several out_dirs
let an ablation reuse the main run's λ = 0 and λ = 100 instead of training them again); the curve is every method
trained on soft weak labels with the plain soft Bradley–Terry objective and no extra arguments, at its
`anchor_coef` (λ = 0 is naive), on the seeds all its points share. Writes `figures/lambda_curve.png` in the last
out_dir (mean ± std over seeds, every seed as a dot; λ = 0 on a symlog axis) and prints the curve as a markdown
table with the per-seed values and a legend under it (ID acc in %, WRG and NTS in percent points).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics

from datamodules.atomic_files import atomic_write
from protocols.engine.published_set import find_set, load_published


def curve_methods(protocol: dict) -> list[tuple[float, str]]:
    """(λ, method name) of the methods that differ from naive only by λ, sorted by λ."""
    out = []
    for m in protocol["methods"]:
        plain = m.get("objective") in ("SoftBradleyTerry", "naive") and not m.get("objective_args") and not any(
            m.get(k) for k in ("sweep", "from_method", "checkpoint", "test_every_validation", "ensemble", "fixed",
                               "teacher"))  # rows that differ from naive by more than λ
        extra = [a for a in m.get("args", []) if not a.startswith("--reference.")]  # reference caching: speed only
        if plain and not extra and m.get("anchor_layers", [1.0]) == [1.0]:
            out.append((float(m.get("anchor_coef", 0.0)), m["name"]))
    if len({lam for lam, _ in out}) != len(out):
        raise ValueError(f"two methods share a λ: {out}")
    return sorted(out)


def curve_rows(runs: list[tuple[dict, dict]]) -> list[dict]:
    """One row per λ over every run ((results, protocol) pairs), restricted to the seeds every row has."""
    rows, seen = [], {}
    for results, protocol in runs:
        id_key = f"acc/{results['id_source']}"
        for lam, name in curve_methods(protocol):
            row = results["rows"].get(name)
            if row is None:
                continue
            if lam in seen:
                raise ValueError(f"λ = {lam:g} is in two runs ({seen[lam]} and {name}): keep it in one")
            seen[lam] = name
            rows.append({"lambda": lam, "method": name,
                         **{k: row[key] for k, key in (("id", id_key), ("nts", "nts"), ("wrg", "wrg"))}})
    if len(rows) < 2:
        raise ValueError("fewer than two λ values in the results: nothing to plot")
    common = set.intersection(*(set(r["id"]["per_seed"]) for r in rows))
    if not common:
        raise ValueError("the λ values share no seed")
    return sorted((_on_seeds(r, common) for r in rows), key=lambda r: r["lambda"])


def _on_seeds(row: dict, seeds: set) -> dict:
    out = dict(row)
    for key in ("id", "nts", "wrg"):
        values = {s: v for s, v in row[key]["per_seed"].items() if s in seeds}
        xs = list(values.values())
        out[key] = {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None,
                    "per_seed": values}
    return out


def markdown(rows: list[dict]) -> str:
    def cell(c: dict) -> str:
        seeds = ", ".join(f"{v:.1f}" for _, v in sorted(c["per_seed"].items(), key=lambda kv: int(kv[0])))
        std = f" ± {c['std']:.1f}" if c.get("std") is not None else ""
        return f"{c['mean']:.1f}{std} ({seeds})"
    lines = ["| λ | method | ID acc | WRG | NTS |", "|---|---|---|---|---|"]
    lines += [f"| {r['lambda']:g} | {r['method']} | {cell(r['id'])} | {cell(r['wrg'])} | {cell(r['nts'])} |"
              for r in rows]
    return "\n".join(lines) + "\n\n" + LEGEND


LEGEND = ("Legend: λ = ANCHOR's coefficient (0 = naive); cells mean ± std over the shared seeds (per-seed values). "
          "ID acc: the student's accuracy on the ID test split (%). WRG: its ID acc − the teacher's (percent points). "
          "NTS: mean AOG − max(0, the teacher's ID acc − its ID acc) (percent points).")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lams = [r["lambda"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for key, label, color in (("id", "ID accuracy (%)", "tab:blue"), ("nts", "NTS (pp)", "tab:orange")):
        means = [r[key]["mean"] for r in rows]
        stds = [r[key]["std"] or 0.0 for r in rows]
        ax.errorbar(lams, means, yerr=stds, marker="o", capsize=3, color=color, label=label)
        for lam, r in zip(lams, rows):
            ys = list(r[key]["per_seed"].values())
            ax.scatter([lam] * len(ys), ys, s=8, color=color, alpha=0.4)
    positive = [lam for lam in lams if lam > 0]
    ax.set_xscale("symlog", linthresh=min(positive) if positive else 1.0)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("λ (ANCHOR coefficient; 0 = naive; symlog scale)")
    ax.set_ylabel("ID accuracy (%) / NTS (percent points)", fontsize=9)
    n = max(len(r["id"]["per_seed"]) for r in rows)
    spread = "; bars: std, dots: seeds" if n > 1 else ""
    ax.set_title(f"ID accuracy and NTS against λ ({n} seed{'s' if n > 1 else ''}{spread})", fontsize=10)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, png.getvalue())


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True, action="append",
                        help="a finished protocol run; repeat it to join runs of the same teacher and data")
    args = parser.parse_args(argv)
    runs = []
    for out_dir in args.out_dir:  # the published set, checked against its stages, and the protocol that made it
        results = load_published(out_dir, rerun_hint="run the protocol on that --out_dir")
        with open(os.path.join(find_set(out_dir), "protocol.json"), encoding="utf-8") as f:
            runs.append((results, json.load(f)))
    rows = curve_rows(runs)
    plot(rows, os.path.join(args.out_dir[-1], "figures", "lambda_curve.png"))
    table = markdown(rows)
    print(table)
    return table


if __name__ == "__main__":
    from protocols.engine.refusals import run_main

    run_main(main)
