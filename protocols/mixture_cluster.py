"""The mixture protocol beyond one machine: one stage of one seed per call (`--stage`, what a cluster job runs), the
report from the stages' records on disk (`--collect`), each stage's state (`--status`), and every unfinished stage
submitted as a SLURM job after its start stage's job (`--launcher slurm`, docs/cluster.md). Stage runs, reuse and
refusal are `protocols.mixture.run_stage`'s, the same as a local run, so the report's tables equal a local run's.

A stage whose run fails (e.g. RL refused by the fidelity gate) is a recorded result here as locally: its job ends
successfully, the stages after it record themselves as skipped, and the collecting job (`afterany`: it reports
whatever happened) writes the same table a local run writes. A job that crashes or is cancelled leaves no record:
`--status` says so, a rerun resubmits it.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from protocols import slurm
from protocols.mixture import (
    Experiment, Stage, _read, finished_record, record_path, run_stage, skipped, stage_folder, stage_lock,
)
from protocols.stage_identity import ForceSpec

COLLECT = slurm.COLLECT


def family_dir(out: str, exp: Experiment) -> str:
    return os.path.join(out, exp.family)


def run_one(exp: Experiment, stages: list[Stage], seed: int, name: str, out: str, extra: dict, threads: int,
            question_dirs: Optional[dict], force: ForceSpec) -> dict:
    """One stage of one seed (a job's work), from its start stage's record on disk, under the stage's own lock."""
    stage = next(s for s in stages if s.name == name)
    upstream = _read(record_path(out, exp, seed, stage.start)) if stage.start else None
    with stage_lock(out, exp, seed, name):
        return run_stage(exp, stage, seed, out, extra, threads, question_dirs, force.forces(name, seed), upstream)


def records_on_disk(exp: Experiment, stages: list[Stage], seeds: list[int], out: str) -> dict[int, dict]:
    """{seed: {stage: record}} as a local run returns them: a stage whose start did not finish is skipped, one that
    has no record although its start finished did not run to its end (its job crashed or was cancelled)."""
    records: dict[int, dict] = {}
    for seed in seeds:
        recs: dict[str, dict] = {}
        for stage in stages:
            upstream = recs.get(stage.start) if stage.start else None
            if stage.start and (upstream is None or upstream["status"] != "done"):
                recs[stage.name] = skipped(stage)
                continue
            rec = _read(record_path(out, exp, seed, stage.name))
            recs[stage.name] = rec or {"status": "failed", "error": "no record: its run did not finish (see --status)"}
        records[seed] = recs
    return records


def status(exp: Experiment, stages: list[Stage], seeds: list[int], out: str, report: str) -> list[dict]:
    rows = []
    for seed in seeds:
        for stage in stages:
            key = f"seed_{seed}/{stage.name}"
            rec = _read(record_path(out, exp, seed, stage.name)) or {}
            job = slurm.read_job(os.path.join(stage_folder(out, exp, key), "job.json"))
            state = slurm.state_of(job, rec.get("status") in ("done", "failed"))
            if rec.get("status") == "failed":
                state = f"failed ({rec.get('error', '')[:80]})"
            rows.append({"stage": key, "state": state, "job_id": (job or {}).get("job_id"),
                         "log": (job or {}).get("log") or rec.get("log")})
    published = os.path.isfile(os.path.join(family_dir(out, exp), f"{report}_results", "results.json"))
    rows.append(slurm.collect_row(os.path.join(stage_folder(out, exp, COLLECT), "job.json"), published))
    return rows


def submit(exp_name: str, exp: Experiment, stages: list[Stage], seeds: list[int], out: str, extra: dict,
           force: ForceSpec, opts: slurm.SlurmOptions, report: str) -> bool:
    """Every unfinished (or forced) stage of every seed as a job after its start stage's job, then the collecting
    job; False when every stage had finished (nothing submitted). The caller holds the family folder's lock and has
    refused finished stages whose configuration or data changed (`changed_stages`). A finished stage whose start
    stage runs again is refused here, as a local run refuses it once the start stage ran, unless that start stage
    was forced (then it follows)."""
    from protocols.stage_identity import refusal

    plan: dict[tuple[int, str], tuple[str, Optional[str]]] = {}  # -> ("reuse" | "in_flight" | "run" | "rerun", job)
    stale = []
    for seed in seeds:
        for stage in stages:
            key = f"seed_{seed}/{stage.name}"
            job = slurm.read_job(os.path.join(stage_folder(out, exp, key), "job.json"))
            if job and slurm.job_state(job["job_id"]) in slurm.IN_FLIGHT:
                plan[seed, stage.name] = ("in_flight", job["job_id"])
                continue
            start = plan.get((seed, stage.start), ("reuse", None))[0] if stage.start else "reuse"
            finished = finished_record(record_path(out, exp, seed, stage.name)) is not None
            if force.forces(stage.name, seed) or start == "rerun":
                plan[seed, stage.name] = ("rerun", None)
            elif not finished:
                plan[seed, stage.name] = ("run", None)
            elif start != "reuse":
                stale.append((os.path.join(family_dir(out, exp), f"seed_{seed}", stage.name),
                              [f"upstream: its start stage {stage.start!r} runs again, which changes what it read"]))
            else:
                plan[seed, stage.name] = ("reuse", None)
    if stale:
        raise refusal(stale)

    python = opts.python or sys.executable
    base = [python, "-m", "protocols.mixture", exp_name, "--out", out, "--report", report,
            "--stages", *[s.name for s in stages]]
    base += [f"--set={a}" for a in extra.get("rl", [])] + [f"--sft-set={a}" for a in extra.get("sft", [])]
    logs = os.path.join(family_dir(out, exp), "logs")
    jobs: dict[tuple[int, str], str] = {k: job for k, (action, job) in plan.items() if action == "in_flight"}
    for seed in seeds:
        for stage in stages:
            action, _ = plan[seed, stage.name]
            if action not in ("run", "rerun"):
                continue
            key = f"seed_{seed}/{stage.name}"
            after = [jobs[seed, stage.start]] if stage.start and (seed, stage.start) in jobs else []
            rerun = ["--force", key] if action == "rerun" else []
            jobs[seed, stage.name] = slurm.submit_stage_job(
                stage_folder(out, exp, key), logs, key, f"mixture:{exp_name}:{key}",
                base + ["--seeds", str(seed), "--stage", stage.name, *rerun], opts, after)
    if not jobs:
        return False
    slurm.submit_stage_job(stage_folder(out, exp, COLLECT), logs, COLLECT, f"mixture:{exp_name}:collect",
                           base + ["--seeds", *map(str, seeds), "--collect"], opts, sorted(set(jobs.values())),
                           collect=True, dependency="afterany")
    return True


def wait(exp: Experiment, out: str) -> None:
    """Until the last submission's jobs (its collecting job last) are done."""
    collect_job = slurm.read_job(os.path.join(stage_folder(out, exp, COLLECT), "job.json"))["job_id"]
    slurm.wait_for([collect_job])
