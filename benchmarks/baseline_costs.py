"""What each W2S method costs, from a finished protocol run (issue 23, docs/benchmarks.md "Robust baselines: cost").

    python -m benchmarks.baseline_costs --out_dir runs/w2s_small_vocab

Every stage records its own wall time (`fit_seconds`: the `cli.py fit` calls; `test_seconds`: a stage that only
evaluates another's checkpoint, validate + test). The stages of one run ran one after another in one process on the
same machine, so their ratios are a like-for-like comparison; run nothing else beside the protocol when the figures
are meant for the docs. Per method: seconds per fit (mean over seeds and swept values, with the range), the ratio to
naive's, how many fits a seed costs, and what the whole sweep costs per seed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.common import machine_info, markdown_table


def stage_seconds(out_dir: str, protocol: dict) -> dict[str, list[tuple[str, int, float, float]]]:
    """method -> [(stage, seed, fit seconds, evaluation seconds)] from every stage's result.json."""
    from protocols.w2s.protocol import Method

    out: dict[str, list[tuple[str, int, float, float]]] = {}
    for m in protocol["methods"]:
        method = Method(**m)
        for name, _, _ in method.variants():
            for seed in protocol["seeds"]:
                path = os.path.join(out_dir, f"seed{seed}", name, "result.json")
                if not os.path.isfile(path):
                    continue
                with open(path, encoding="utf-8") as f:
                    r = json.load(f)
                out.setdefault(method.name, []).append((name, seed, r.get("fit_seconds") or 0.0,
                                                        r.get("test_seconds") or 0.0))
    return out


def cost_table(out_dir: str) -> str:
    with open(os.path.join(out_dir, "results", "protocol.json"), encoding="utf-8") as f:
        protocol = json.load(f)
    seconds = stage_seconds(out_dir, protocol)
    naive = statistics.fmean(s for _, _, s, _ in seconds.get("naive", [("", 0, float("nan"), 0.0)]))
    rows = []
    for method, stages in seconds.items():
        seeds = len({seed for _, seed, _, _ in stages})
        fits = [s for _, _, s, _ in stages if s > 0]
        evals = [e for _, _, _, e in stages if e > 0]
        per_seed = (sum(fits) + sum(evals)) / seeds
        if fits:
            mean = statistics.fmean(fits)
            cell = f"{mean:.1f} ({min(fits):.1f}–{max(fits):.1f})"
            ratio = f"{mean / naive:.2f}×"
        else:
            cell, ratio = "– (no fit)", f"evaluations: {statistics.fmean(evals):.1f} s each"
        rows.append([method, cell, ratio, str(len(stages) // seeds), f"{per_seed:.0f}", str(seeds)])
    return markdown_table(["method", "s per fit (range)", "vs naive", "stages per seed", "s per seed (whole sweep)",
                           "seeds"], rows)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True, help="a finished W2S protocol run")
    args = parser.parse_args(argv)
    text = cost_table(args.out_dir)
    info = machine_info()
    print(f"machine: {info.get('cpu', '?')}, {info.get('cores', '?')} cores\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
