"""Shared by the Part B slow tests (tests/test_mixture_slow.py, tests/test_mixture_smollm2_slow.py): run an experiment
by its documented command once per test session, and read its 3-seed summaries."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from tests.doc_tables import ROOT, documented_table, parse_dominant, parse_mean_std_table

SEEDS = (0, 1, 2)
_runs: dict[tuple[str, str], dict] = {}


def results(experiment: str, root) -> dict:
    """The experiment's `<experiment>_seeds_0-1-2_results.json`, run once per test session into `root` by its
    documented command (seeds in parallel, the protocol's default --jobs)."""
    key = (experiment, str(root))
    if key not in _runs:
        from protocols.mixture import EXPERIMENTS as DEFINED

        subprocess.run([sys.executable, "-m", "protocols.mixture", experiment, "--seeds", *map(str, SEEDS),
                        "--out", str(root)], cwd=ROOT, check=True)
        path = os.path.join(root, DEFINED[experiment].family,
                            f"{experiment}_seeds_{'-'.join(map(str, SEEDS))}_results.json")
        with open(path) as f:
            _runs[key] = json.load(f)
    return _runs[key]


def rl_stages(experiment: str) -> list[str]:
    from protocols.mixture import EXPERIMENTS as DEFINED

    return [s.name for s in DEFINED[experiment].stages if not s.sft]


def allowed(mean_std: tuple[float, float]) -> float:
    """A documented cell's tolerance: max(2.5 σ, 0.05) (tests/test_mixture_slow.py's docstring says why)."""
    return max(2.5 * mean_std[1], 0.05)


def table_problems(experiment: str, stage: str, root) -> list[str]:
    """Every cell of the documented before/after table `mixture-<experiment>-<stage>` (docs/policy_mixtures.md) that
    the regenerated run misses by more than `allowed`, and every "dominant after" cell that differs at all."""
    from protocols.mixture_report import summary_markdown

    table = documented_table("policy_mixtures.md", f"mixture-{experiment}-{stage}")
    ran = summary_markdown(results(experiment, root)["stages"][stage]["summary"])
    return cell_problems(table, ran)


def cell_problems(documented_md: str, measured_md: str) -> list[str]:
    """`table_problems` on two Markdown tables: mean ± std cells within `allowed`, "dominant after" exactly (the
    per-seed outcome: who dominates and in how many seeds, the untagged seeds and the share columns' persona)."""
    documented, measured = parse_mean_std_table(documented_md), parse_mean_std_table(measured_md)
    assert set(documented) == set(measured)
    problems = [f"{row} / {col}: documented {doc[0]} ± {doc[1]}, measured {measured[row].get(col)}"
                for row, cols in documented.items() for col, doc in cols.items()
                if col not in measured[row] or abs(measured[row][col][0] - doc[0]) > allowed(doc)]
    doc_dom, run_dom = parse_dominant(documented_md), parse_dominant(measured_md)
    return problems + [f"{row} / dominant after: documented {doc}, measured {run_dom.get(row)}"
                       for row, doc in doc_dom.items() if run_dom.get(row) != doc]


def summary(experiment: str, stage: str, root) -> dict:
    stages = results(experiment, root)["stages"]
    assert all(r["status"] == "done" for r in stages[stage]["records"].values()), stages[stage]["records"]
    return stages[stage]["summary"]


def mean(summary_: dict, dist: str, column: str) -> float:
    values = summary_["rows"][dist][column]
    assert len(values) == len(SEEDS)
    return sum(values) / len(values)


def per_seed_at_step(summary_: dict, step: int, key: str) -> list[float]:
    """A history column's per-seed values at one evaluation step (NaN: a persona that no longer speaks)."""
    return summary_["history"][str(step)][key]


def at_step(summary_: dict, step: int, key: str) -> float:
    """Mean over seeds of a history column at one evaluation step (NaN seeds, a persona that no longer speaks, left
    out; at least one seed must have the value)."""
    values = [v for v in per_seed_at_step(summary_, step, key) if not math.isnan(v)]
    assert values, (step, key)
    return sum(values) / len(values)


def winners(summary_: dict, dist: str) -> set:
    return set(summary_["winners"][dist].values())


def seed_metrics(experiment: str, stage: str, root) -> dict[int, dict[int, dict]]:
    """{seed: {step: metrics}} from each seed's own table (`PersonaTrackingCallback`'s `<stage>_table.json`, the path its
    stage record names): every tracked key per persona, where the over-seeds history keeps only the modal persona's."""
    records = results(experiment, root)["stages"][stage]["records"]
    out = {}
    for seed in SEEDS:
        with open(records[str(seed)]["table"]) as f:
            out[seed] = {h["step"]: h["metrics"] for h in json.load(f)["history"]}
    return out
