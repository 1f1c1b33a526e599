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
import time
from typing import Callable, Optional

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


def _job_path(out: str, exp: Experiment, key: str) -> str:
    return os.path.join(stage_folder(out, exp, key), "job.json")


def _recorded_states(out: str, exp: Experiment, keys: list[str]) -> slurm.JobStates:
    """The states of every recorded job of these stages (and the collecting job): one bounded `squeue`."""
    jobs = [slurm.read_job(_job_path(out, exp, k)) for k in [*keys, COLLECT]]
    return slurm.query_states([j["job_id"] for j in jobs if j])


def _keys(stages: list[Stage], seeds: list[int]) -> list[str]:
    return [f"seed_{seed}/{stage.name}" for seed in seeds for stage in stages]


def status(exp: Experiment, stages: list[Stage], seeds: list[int], out: str, report: str,
           changed: Optional[Callable[[int, Stage, dict], list[str]]] = None) -> list[dict]:
    """Each stage of each seed (and the collecting job) as done / queued / running / failed (with the recorded
    error) / skipped / not started, with job id and the log when there is one; SLURM is asked once for every job.
    `changed(seed, stage, record)`: what a rerun would refuse of a finished stage, shown as "changed (...)";
    None: not checked."""
    states = _recorded_states(out, exp, _keys(stages, seeds))
    rows = []
    for seed in seeds:
        ended: dict[str, str] = {}
        for stage in stages:
            key = f"seed_{seed}/{stage.name}"
            rec = _read(record_path(out, exp, seed, stage.name)) or {}
            job = slurm.read_job(_job_path(out, exp, key))
            state = slurm.state_of(job, rec.get("status") in ("done", "failed"), states)
            if state == "done" and rec.get("status") == "failed":
                state = f"failed ({rec.get('error', '')[:80]})"
            elif not rec and stage.start and state not in ("queued", "running") and ended[stage.start] != "done":
                state = f"skipped (its start stage {stage.start!r} did not finish)"  # its job ran, or was cancelled
            diff = changed(seed, stage, rec) if changed and state == "done" else []
            if diff:
                state = f"changed (a rerun refuses it: {diff[0][:100]}; --force {key} reruns it)"
            ended[stage.name] = state
            rows.append(slurm.job_row(key, job, state, states, log=rec.get("log")))
    table = os.path.join(family_dir(out, exp), f"{report}_results", "results.json")
    rows.append(slurm.collect_row(_job_path(out, exp, COLLECT), table, states))
    return rows


def submit(exp_name: str, exp: Experiment, stages: list[Stage], seeds: list[int], out: str, extra: dict,
           force: ForceSpec, opts: slurm.SlurmOptions, report: str, command: Optional[str] = None) -> bool:
    """Every unfinished (or forced) stage of every seed as a job after its start stage's job, then the collecting
    job; False when every stage had finished (nothing submitted). The caller holds the family folder's lock and has
    refused finished stages whose configuration or data changed (`changed_stages`). Before anything is submitted:
    SLURM answers and the time limits fit the partition (`slurm.check_cluster`), and a finished stage whose start
    stage runs again is refused, as a local run refuses it once the start stage ran, unless that start stage was
    forced (then it follows). A refusal partway cancels what this call submitted (`slurm.Submission`). `command`:
    the submitting command, recorded for the report (default: an equivalent one)."""
    to_run = any(finished_record(record_path(out, exp, seed, s.name)) is None or force.forces(s.name, seed)
                 for seed in seeds for s in stages)
    if to_run:  # a run finished on disk needs no SLURM: its report is written here
        slurm.check_cluster(opts)
    states = _recorded_states(out, exp, _keys(stages, seeds))
    if states.unreachable and to_run:
        raise RuntimeError(f"--launcher slurm: SLURM could not be reached, nothing was submitted: {states.unreachable}")
    plan = _plan(exp, stages, seeds, out, force, states)
    jobs: dict[tuple[int, str], str] = {k: job for k, (action, job) in plan.items() if action == "in_flight"}
    if not jobs and all(action == "reuse" for action, _ in plan.values()):
        return False
    base = [opts.python or sys.executable, "-m", "protocols.mixture", exp_name, "--out", out, "--report", report,
            "--stages", *[s.name for s in stages]]
    base += [f"--set={a}" for a in extra.get("rl", [])] + [f"--sft-set={a}" for a in extra.get("sft", [])]
    logs = os.path.join(family_dir(out, exp), "logs")
    name = f"mixture:{os.path.basename(out)}:{exp_name}"  # as W2S jobs: which out folder, then which stage
    with slurm.Submission() as sub:
        for seed in seeds:
            for stage in stages:
                action, _ = plan[seed, stage.name]
                if action not in ("run", "rerun"):
                    continue
                key = f"seed_{seed}/{stage.name}"
                after = [jobs[seed, stage.start]] if stage.start and (seed, stage.start) in jobs else []
                rerun = ["--force", key] if action == "rerun" else []
                jobs[seed, stage.name] = slurm.submit_stage_job(
                    sub, stage_folder(out, exp, key), logs, key, f"{name}:{key}",
                    base + ["--seeds", str(seed), "--stage", stage.name, *rerun], opts, {"afterok": after})
        submitting = command or " ".join(["python -m protocols.mixture", *base[3:], "--seeds", *map(str, seeds),
                                          "--launcher", "slurm"])
        slurm.submit_collect(sub, stage_folder(out, exp, COLLECT), logs, f"{name}:{COLLECT}",
                             base + ["--seeds", *map(str, seeds), "--collect"], opts,
                             {"afterany": sorted(set(jobs.values()))}, states, extra={"command": submitting})
    return True


def _plan(exp: Experiment, stages: list[Stage], seeds: list[int], out: str, force: ForceSpec,
          states: slurm.JobStates) -> dict[tuple[int, str], tuple[str, Optional[str]]]:
    """(seed, stage) -> ("reuse" | "in_flight" | "run" | "rerun", job id); refuses a finished stage whose start
    stage runs again without being forced."""
    from protocols.stage_identity import refusal

    plan: dict[tuple[int, str], tuple[str, Optional[str]]] = {}
    stale = []
    for seed in seeds:
        for stage in stages:
            job = slurm.read_job(_job_path(out, exp, f"seed_{seed}/{stage.name}"))
            if job and states.of(job["job_id"]) in slurm.IN_FLIGHT:
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
    return plan


def collected_run(exp: Experiment, out: str) -> Optional[tuple[str, float]]:
    """(the submitting command, seconds from that submission to now) when this process is the collecting job
    recorded for `out` (SLURM_JOB_ID), else None. The report that job writes then says what was submitted and how
    long the run took from submission to table, as a local run's report does, not its own `--collect` call."""
    job = slurm.read_job(_job_path(out, exp, COLLECT))
    if not job or os.environ.get("SLURM_JOB_ID") != str(job["job_id"]) or not job.get("command"):
        return None
    return job["command"], time.time() - job["submitted"]


def wait(exp: Experiment, out: str) -> None:
    """Until the last submission's jobs (its collecting job last) are done."""
    slurm.wait_for([slurm.read_job(_job_path(out, exp, COLLECT))["job_id"]])
