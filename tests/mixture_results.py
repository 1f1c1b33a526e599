"""Shared by the Part B slow tests (tests/test_mixture_slow.py, tests/test_mixture_smollm2_slow.py): run an experiment
by its documented command once per test session, read its 3-seed summaries, compare its marked tables on the machine
that made them, and check the published claims that read its sets (issue 50, docs/claims.md).

A marked table `mixture-<experiment>-<stage>` of docs/policy_mixtures.md is a set: its header in
docs/claims/policy_mixtures.yaml records the machine fingerprint id of the run that made it. A rerun whose
results.json `machine.id` is that id must reproduce every cell as printed (tolerance 0, per-seed values and the
"dominant after" cell included); on any other machine the cells are not compared and only the claims are checked,
with their counts as written."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Optional

from tests.claims import PAGES, UNRECORDED, Claim, check, load_claims, numbers_digest, recorded_on, sets_of
from tests.claims import run_machine as machine_id  # the name the Part B slow tests read
from tests.doc_tables import ROOT, documented_table, parse_dominant

SEEDS = (0, 1, 2)
PAGE = "policy_mixtures"  # the claims file whose `sets:` header records each marked Part B table's machine
IGNORED_COLUMNS = ("wall s",)  # how long a stage took on a busy machine: not a result
_runs: dict[tuple[str, str], dict] = {}


def results(experiment: str, root) -> dict:
    """The experiment's `<experiment>_seeds_0-1-2_results.json`, run once per test session into `root` by its
    documented command (seeds in parallel, the protocol's default --jobs)."""
    key = (experiment, str(root))
    if key not in _runs:
        from protocols.mixture.protocol import EXPERIMENTS as DEFINED

        subprocess.run([sys.executable, "-m", "protocols.mixture", experiment, "--seeds", *map(str, SEEDS),
                        "--out", str(root)], cwd=ROOT, check=True)
        path = os.path.join(root, DEFINED[experiment].family,
                            f"{experiment}_seeds_{'-'.join(map(str, SEEDS))}_results.json")
        with open(path) as f:
            _runs[key] = json.load(f)
    return _runs[key]


def is_sft(experiment: str, stage: str) -> bool:
    from protocols.mixture.protocol import EXPERIMENTS as DEFINED

    return any(s.name == stage and s.sft for s in DEFINED[experiment].stages)


# ---- sets: the marked tables ------------------------------------------------------------------------------------
def set_name(experiment: str, stage: str) -> str:
    return f"mixture-{experiment}-{stage}"


def split_set(name: str) -> tuple[str, str]:
    """'mixture-two_policies_selection-two_policies_rl_A_lr3e-4' -> (experiment, stage): experiment names have no
    '-', stage names may."""
    prefix, experiment, stage = name.split("-", 2)
    assert prefix == "mixture", name
    return experiment, stage


def marked_stages(experiment: str) -> list[str]:
    """The experiment's stages whose table docs/policy_mixtures.md marks: every RL stage (a missing marker fails in
    `documented_table`) and the SFT stages marked because a claim reads them."""
    text = open(os.path.join(ROOT, "docs", "policy_mixtures.md"), encoding="utf-8").read()
    from protocols.mixture.protocol import EXPERIMENTS as DEFINED

    return [s.name for s in DEFINED[experiment].stages
            if not s.sft or f"<!-- table: {set_name(experiment, s.name)} -->" in text]


def recorded_machine(experiment: str, stage: str) -> str:
    """The machine the claims header records for a marked table (unrecorded where no header declares it)."""
    return sets_of(PAGE).get(set_name(experiment, stage), {}).get("machine") or UNRECORDED


def made_here(experiment: str, stage: str, run: dict) -> bool:
    """Whether `run` was made on the machine that made the marked table: then its cells must come back exactly."""
    return recorded_on(sets_of(PAGE).get(set_name(experiment, stage), {}), machine_id(run))


def published_run(experiment: str, stage: str, root) -> dict:
    """A stage's summary for a reading of the page that no claim carries (a history mean at a step): such a reading
    is a cell of the published run, so it is asserted only on the machine that made it (issue 50: elsewhere the
    claims are checked instead); skipped, saying so, on any other."""
    import pytest

    run = results(experiment, root)
    if not made_here(experiment, stage, run):
        pytest.skip(f"{set_name(experiment, stage)} was made on machine {recorded_machine(experiment, stage)}, this "
                    f"rerun on {machine_id(run)}: the page's readings of its history are not asserted here, its "
                    "claims are (test_documented_claims_hold)")
    return summary(experiment, stage, root)


# ---- the stage a set holds ----------------------------------------------------------------------------------------
def summary(experiment: str, stage: str, root) -> dict:
    stages = results(experiment, root)["stages"]
    assert all(r["status"] == "done" for r in stages[stage]["records"].values()), stages[stage]["records"]
    return stages[stage]["summary"]


def sft_summary(experiment: str, stage: str, root) -> dict:
    """An SFT stage's records as a summary's rows (`rows.sft.<field>`: steps, fidelity_mean, fidelity_min,
    capability; one value per seed, seed order), the form a claim reads (docs/claims/policy_mixtures.yaml)."""
    records = results(experiment, root)["stages"][stage]["records"]
    assert all(records[str(s)]["status"] == "done" for s in SEEDS), records
    fields = records[str(SEEDS[0])]["sft"]
    return {"rows": {"sft": {f: [records[str(s)]["sft"][f] for s in SEEDS] for f in fields}}}


def stage_summary(experiment: str, stage: str, root) -> dict:
    """What a claim on the set `mixture-<experiment>-<stage>` reads: the RL stage's summary, or an SFT stage's
    records as rows."""
    return sft_summary(experiment, stage, root) if is_sft(experiment, stage) else summary(experiment, stage, root)


def stage_markdown(experiment: str, stage: str, root) -> str:
    """The stage's table as the protocol renders it (its report's own rendering, which the docs copy)."""
    from protocols.mixture.report import sft_markdown, summary_markdown

    if is_sft(experiment, stage):
        records = results(experiment, root)["stages"][stage]["records"]
        return sft_markdown({int(s): r for s, r in records.items()})
    return summary_markdown(summary(experiment, stage, root))


# ---- exact mode: the marked table cell for cell ---------------------------------------------------------------------
def table_check(experiment: str, stage: str, root) -> Optional[list[str]]:
    """The marked table against the rerun, where this machine made it: every cell that differs as printed, and a
    changed digest of the stage's numbers where the header records one. None on any other machine (cells not
    compared: the claims test checks the statements)."""
    run = results(experiment, root)
    if not made_here(experiment, stage, run):
        return None
    name = set_name(experiment, stage)
    problems = cell_problems(documented_table("policy_mixtures.md", name), stage_markdown(experiment, stage, root))
    recorded = sets_of(PAGE)[name].get("numbers")
    if recorded and numbers_digest(run["stages"][stage]) != recorded:
        problems.append(f"{name}: a number differs from the published run (digest {numbers_digest(run['stages'][stage])}"
                        f", recorded {recorded})")
    return problems


def _cells(markdown: str) -> dict[str, dict[str, str]]:
    """{row label: {column header: the cell as printed}} of a Markdown table (bold marks dropped)."""
    lines = [l.strip() for l in markdown.splitlines() if l.strip().startswith("|")]
    assert len(lines) >= 3, f"not a Markdown table:\n{markdown}"
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.replace("**", "").strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


def cell_problems(documented_md: str, measured_md: str) -> list[str]:
    """Every documented cell the measured table does not print identically (tolerance 0: the mean, the std and each
    per-seed value as printed); the "dominant after" cell compared as its parts (who dominates, in how many seeds, the
    untagged seeds, the share columns' persona). Wall times are not compared."""
    documented, measured = _cells(documented_md), _cells(measured_md)
    assert set(documented) == set(measured), (sorted(documented), sorted(measured))
    problems = [f"{row} / {col}: documented {text}, measured {measured[row].get(col)}"
                for row, cols in documented.items() for col, text in cols.items()
                if col not in (*IGNORED_COLUMNS, "dominant after") and measured[row].get(col) != text]
    if "dominant after" not in next(iter(documented.values())):
        return problems
    doc_dom, run_dom = parse_dominant(documented_md), parse_dominant(measured_md)
    return problems + [f"{row} / dominant after: documented {doc}, measured {run_dom.get(row)}"
                       for row, doc in doc_dom.items() if run_dom.get(row) != doc]


# ---- claims mode (and the claims' stated numbers in exact mode) ---------------------------------------------------
def module_claims(experiments: tuple[str, ...]) -> list[Claim]:
    """Every published claim (docs/policy_mixtures.md, the README, docs/results.md) whose sets are all made by these
    experiments."""
    return [c for page in PAGES for c in load_claims(page)
            if all(s.startswith("mixture-") and split_set(s)[0] in experiments for s in c.set_names)]


def claims_report(experiments: tuple[str, ...], root, claims: Optional[list[Claim]] = None) -> dict:
    """`tests.claims.check` of `module_claims` against the reruns: {claim id: (mode, problems)}. A set these
    experiments do not make raises KeyError (skipped by `check`)."""
    def load(name: str) -> dict:
        experiment, stage = split_set(name)
        if experiment not in experiments:
            raise KeyError(name)
        return stage_summary(experiment, stage, root)

    return check(module_claims(experiments) if claims is None else claims, load,
                 lambda name: machine_id(results(split_set(name)[0], root)))


# ---- readings the claims cannot express (means over seeds, each seed's own history) -----------------------------------
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


def seed_metrics(experiment: str, stage: str, root) -> dict[int, dict[int, dict]]:
    """{seed: {step: metrics}} from each seed's own table (`PersonaTrackingCallback`'s `<stage>_table.json`, the path its
    stage record names): every tracked key per persona, where the over-seeds history keeps only the modal persona's."""
    records = results(experiment, root)["stages"][stage]["records"]
    out = {}
    for seed in SEEDS:
        with open(records[str(seed)]["table"]) as f:
            out[seed] = {h["step"]: h["metrics"] for h in json.load(f)["history"]}
    return out
