"""The TensorBoard / PNG figures of a W2S protocol run (`write_figures`: the AOG heatmap, NTS bars, drift against
mean OOD accuracy) and the drift-OOD correlation printed under the table; protocols/w2s/report.py writes them."""
from __future__ import annotations

import io
import math
import os
import statistics
from typing import Optional

from datamodules.atomic_files import atomic_write
from protocols.w2s.teacher_report import WEAK_LABEL_METHODS_EXCLUDED


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


def headline_drift_keys(table: dict) -> list[str]:
    """The OOD-mean drift at the deepest measured layer: MSE and CKA (the results-table columns)."""
    keys = {k for row in table.values() for k in row if k.startswith("drift/ood_mean/")}
    if not keys:
        return []
    deepest = max(int(k.rsplit("layer", 1)[1]) for k in keys)
    return [k for k in (f"drift/ood_mean/mse/layer{deepest}", f"drift/ood_mean/cka/layer{deepest}") if k in keys]
