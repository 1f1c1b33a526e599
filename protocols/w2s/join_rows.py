"""One table from rows of several finished protocol runs of the same teacher and data (issue 10's ablations):

    python -m protocols.w2s.join_rows --row runs/w2s_small_vocab:naive --row runs/w2s_small_vocab_ablations:naive_hard

Each `--row OUT_DIR:METHOD` takes that method's row from `<OUT_DIR>/results.json`; every row is cut to the seeds all
rows share (or `--seeds`), then shown as mean ± std with the per-seed values of NTS. Rows of different teachers or
data would not be comparable: the runs must share the teacher config, data and seeds (the ablation configs do).
"""
from __future__ import annotations

import argparse
import os
import statistics
from typing import Optional

from protocols.engine.published_set import find_set, load_published


def load_row(spec: str) -> tuple[str, dict, dict]:
    out_dir, sep, method = spec.rpartition(":")
    if not sep or not out_dir or not method:
        raise SystemExit(f"join_rows: --row {spec!r} is not OUT_DIR:METHOD")
    path = os.path.join(find_set(out_dir), "results.json")
    results = load_published(out_dir, rerun_hint=f"run the protocol on {out_dir}")
    if method not in results["rows"]:
        raise SystemExit(f"join_rows: {path} has no row {method!r}; rows: {sorted(results['rows'])}")
    return method, results["rows"][method], results


def cell(c: dict, seeds: list[str], signed: bool, per_seed: bool = False) -> str:
    """mean ± std over `seeds` (gains signed, accuracies not), optionally with the per-seed values."""
    xs = [c["per_seed"][s] for s in seeds]
    std = f" ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else ""
    tail = " (" + ", ".join(f"{x:+.1f}" for x in xs) + ")" if per_seed else ""
    return f"{statistics.fmean(xs):{'+' if signed else ''}.1f}{std}{tail}"


def join(specs: list[str], seeds: Optional[list[str]] = None) -> str:
    rows = [load_row(s) for s in specs]
    first = rows[0][2]
    targets, id_key = first["targets"], f"acc/{first['id_source']}"
    for _, _, results in rows[1:]:
        if results["targets"] != targets or results["id_source"] != first["id_source"]:
            raise SystemExit("join_rows: the runs have different sources or targets")
    common = sorted(set.intersection(*(set(r[id_key]["per_seed"]) for _, r, _ in rows)), key=int)
    seeds = seeds or common
    missing = [s for s in seeds if s not in common]
    if missing or not seeds:
        raise SystemExit(f"join_rows: seeds {missing or seeds} are not in every row (common: {common})")
    keys = [(id_key, "ID acc"), ("wrg", "WRG"), *[(f"aog/{t}", f"AOG {t}") for t in targets], ("nts", "NTS")]
    lines = [f"Mean ± std over seeds {', '.join(seeds)}; NTS with its per-seed values.", "",
             "| method | " + " | ".join(name for _, name in keys) + " |", "|---|" + "---|" * len(keys)]
    for method, row, _ in rows:
        cells = [cell(row[key], seeds, signed=key != id_key, per_seed=key == "nts") for key, _ in keys]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", action="append", required=True, help="OUT_DIR:METHOD (repeat)")
    parser.add_argument("--seeds", nargs="*", default=None, help="restrict to these seeds (default: all shared)")
    args = parser.parse_args(argv)
    table = join(args.row, args.seeds)
    print(table)
    return table


if __name__ == "__main__":
    from protocols.engine.refusals import run_main

    run_main(main)
