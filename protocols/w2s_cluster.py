"""The W2S protocol beyond one process: one stage per call (`--stage`, what a cluster job runs), the table from
finished stages (`--collect`), each stage's state (`--status`), and every unfinished stage submitted as a SLURM job
(`--launcher slurm`, docs/cluster.md). The decisions are `protocols.w2s`'s own: the same identity, reuse and refusal
rules, the same per-stage lock and atomic writes, so a cluster run's table equals a local run's.
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from typing import Callable, Optional

from protocols import slurm
from protocols.run_files import OutDirLock, is_global_zero, read_json
from protocols.stage_identity import ForceSpec, refusal
from protocols.w2s import (
    Stage, W2SProtocol, _identity, plan_stages, prepare, publish_results, refuse_changed_stages, results_dir,
    run_or_reuse, stage_changes, stage_key, stage_lock, upstream_identity,
)

COLLECT = slurm.COLLECT


def stage_folder(out_dir: str, key: str) -> str:
    """`<out_dir>/.stages/<seed>/<stage>`: the stage's lock and its job record (outside the stage folder, which a
    rerun deletes)."""
    return os.path.join(out_dir, ".stages", key)


def _find(stages: list[Stage], key: str) -> Stage:
    for stage in stages:
        if stage_key(stage) == key:
            return stage
    raise ValueError(f"--stage {key!r}: no such stage; the stages are {[stage_key(s) for s in stages]}")


def _finished_upstream(stage: Stage, stages: list[Stage]) -> dict[str, dict[int, dict]]:
    done: dict[str, dict[int, dict]] = {}
    for name in stage.upstream:
        up = _find(stages, f"seed{stage.seed}/{name}")
        result = read_json(up.result_path)
        if result is None:
            raise RuntimeError(f"stage {stage_key(stage)} reads {stage_key(up)}, which has not finished "
                               f"(no {up.result_path})")
        done.setdefault(name, {})[stage.seed] = result
    return done


def run_one_stage(p: W2SProtocol, key: str, force: ForceSpec) -> dict:
    """One stage (a cluster job's work), from its finished upstream stages' results on disk, under its own lock."""
    stages = plan_stages(p)
    stage = _find(stages, key)
    stages = prepare(p, force, only={key, *(f"seed{stage.seed}/{u}" for u in stage.upstream)})
    stage = _find(stages, key)
    with stage_lock(p.out_dir, stage):
        return run_or_reuse(stage, _finished_upstream(stage, stages), force, set())


def collect(p: W2SProtocol) -> dict:
    """The table from every stage's finished result (refused, naming them, while any is unfinished or changed)."""
    stages = prepare(p, ForceSpec(None))
    missing = [stage_key(s) for s in stages if read_json(s.result_path) is None]
    if missing:
        raise RuntimeError(f"--collect: {len(missing)} stage(s) have not finished: {missing} "
                           f"(python -m protocols.w2s --config ... --status shows why)")
    with OutDirLock(p.out_dir) if is_global_zero() else nullcontext():
        refuse_changed_stages(stages, ForceSpec(None))
        done: dict[str, dict[int, dict]] = {}
        for stage in stages:  # every result is finished: this only checks identities, it runs nothing
            done.setdefault(stage.name, {})[stage.seed] = run_or_reuse(stage, done, ForceSpec(None), set())
        return publish_results(p, stages, done)


def _job_path(out_dir: str, key: str) -> str:
    return os.path.join(stage_folder(out_dir, key), "job.json")


def _recorded_states(out_dir: str, keys: list[str]) -> slurm.JobStates:
    """The states of every recorded job of these stages (and the collecting job): one bounded `squeue`."""
    jobs = [slurm.read_job(_job_path(out_dir, k)) for k in [*keys, COLLECT]]
    return slurm.query_states([j["job_id"] for j in jobs if j])


def status(p: W2SProtocol, changed: Optional[Callable[[Stage, dict], list[str]]] = None) -> list[dict]:
    """Each stage (and the collecting job) as done / queued / running / failed / not started, with job id and the
    log when there is one; SLURM is asked once for every job (`slurm.state_of` says how disk and SLURM combine).
    `changed(stage, result)`: what a rerun would refuse of a finished stage (its identity changes), shown as
    "changed (...)" instead of done; None: not checked (status then reads files and SLURM only, no model config)."""
    stages = plan_stages(p)
    states = _recorded_states(p.out_dir, [stage_key(s) for s in stages])
    rows = []
    for stage in stages:
        key = stage_key(stage)
        job = slurm.read_job(_job_path(p.out_dir, key))
        result = read_json(stage.result_path)
        state = slurm.state_of(job, result is not None, states)
        diff = changed(stage, result) if changed and state == "done" else []
        if diff:
            state = f"changed (a rerun refuses it: {diff[0][:100]}; --force {key} reruns it)"
        rows.append(slurm.job_row(key, job, state, states))
    table = os.path.join(results_dir(p), "results.json")
    rows.append(slurm.collect_row(_job_path(p.out_dir, COLLECT), table, states))
    return rows


# ---- submission --------------------------------------------------------------------------------------------------
def submit(p: W2SProtocol, force: ForceSpec, opts: slurm.SlurmOptions, wait: bool = False) -> list[dict]:
    """Every stage that is not finished (or is forced) as a job after its upstream stages' jobs, then the collecting
    job; returns the status rows. Before anything is written or submitted: SLURM answers and the time limits fit
    the partition (`slurm.check_cluster`), and finished stages of another identity are refused, as a local run
    refuses them; a stage whose job is queued or running is left to it. A refusal partway cancels what this call
    submitted and removes what it wrote (`slurm.Submission`)."""
    if opts.world_size > 1:  # the stages' trainers span the job's processes (Lightning reads SLURM's environment)
        extra = opts.trainer_args()
        p.teacher_args, p.student_args, p.zero_shot_args = (p.teacher_args + extra, p.student_args + extra,
                                                            p.zero_shot_args + extra)
    stages = prepare(p, force)
    to_run = any(read_json(s.result_path) is None or force.forces(s.name, s.seed) for s in stages)
    if to_run:  # a run finished on disk needs no SLURM: its table is written here
        slurm.check_cluster(opts)
    with OutDirLock(p.out_dir):
        refuse_changed_stages(stages, force)
        states = _recorded_states(p.out_dir, [stage_key(s) for s in stages])
        if states.unreachable and to_run:
            raise RuntimeError(f"--launcher slurm: SLURM could not be reached, nothing was submitted: "
                               f"{states.unreachable}")
        plan = _plan(p, stages, force, states)
        jobs = {key: job_id for key, (action, job_id) in plan.items() if action == "in_flight"}
        if jobs or any(action == "submit" for action, _ in plan.values()):
            with slurm.Submission() as sub:
                _submit_all(sub, p, stages, plan, jobs, opts, states)
    if not jobs:  # every stage finished: the table now, as a local run writes it
        collect(p)
    elif wait:
        slurm.wait_for(sorted(set(jobs.values())) + [slurm.read_job(_job_path(p.out_dir, COLLECT))["job_id"]])
    return status(p)


def _submit_all(sub: slurm.Submission, p: W2SProtocol, stages: list[Stage], plan: dict, jobs: dict[str, str],
                opts: slurm.SlurmOptions, states: slurm.JobStates) -> None:
    """The protocol's snapshot (what the jobs read), each stage to run after its upstream stages' jobs, then the
    collecting job after every job in flight; `jobs` gains the new ones."""
    now = time.time()  # to the microsecond: two submissions within a second must not share one while jobs wait
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now * 1e6) % 1_000_000:06d}"
    snapshot = os.path.join(p.out_dir, ".stages", f"protocol-{stamp}-{os.getpid()}.json")
    sub.write(snapshot, json.dumps(asdict(p), indent=2) + "\n")
    command = [opts.python or sys.executable, "-m", "protocols.w2s", "--config", snapshot]
    for stage in stages:
        key = stage_key(stage)
        if plan[key][0] != "submit":
            continue
        after = [jobs[f"seed{stage.seed}/{u}"] for u in stage.upstream if f"seed{stage.seed}/{u}" in jobs]
        rerun = ["--force", key] if read_json(stage.result_path) is not None else []
        jobs[key] = slurm.submit_stage_job(sub, stage_folder(p.out_dir, key), _logs(p), key, _name(p, key),
                                           command + ["--stage", key, *rerun], opts, {"afterok": after})
    slurm.submit_collect(sub, stage_folder(p.out_dir, COLLECT), _logs(p), _name(p, COLLECT), command + ["--collect"],
                         opts, {"afterok": sorted(set(jobs.values()))}, states)


def _logs(p: W2SProtocol) -> str:
    return os.path.join(p.out_dir, "logs")


def _name(p: W2SProtocol, key: str) -> str:
    return f"w2s:{os.path.basename(os.path.abspath(p.out_dir))}:{key}"


def _plan(p: W2SProtocol, stages: list[Stage], force: ForceSpec,
          states: slurm.JobStates) -> dict[str, tuple[str, Optional[str]]]:
    """key -> ("done" | "in_flight" | "submit", job id). A finished stage whose upstream will run again follows it
    when that upstream is forced (or follows a forced one); otherwise it is refused, as a local run would refuse it
    once the upstream ran."""
    plan: dict[str, tuple[str, Optional[str]]] = {}
    rerun: set[str] = set()  # keys that will run again because they, or an upstream, were forced
    stale = []
    for stage in stages:
        key = stage_key(stage)
        job = slurm.read_job(_job_path(p.out_dir, key))
        if job and states.of(job["job_id"]) in slurm.IN_FLIGHT:
            plan[key] = ("in_flight", job["job_id"])
            continue
        ups = [f"seed{stage.seed}/{u}" for u in stage.upstream]
        forced = force.forces(stage.name, stage.seed) or any(u in rerun for u in ups)
        finished = read_json(stage.result_path)
        if forced:
            rerun.add(key)
            plan[key] = ("submit", None)
        elif finished is None:
            plan[key] = ("submit", None)
        elif any(plan[u][0] != "done" for u in ups):
            stale.append((stage.dir, [f"upstream: {', '.join(u for u in ups if plan[u][0] != 'done')} will run "
                                      "again (unfinished), which changes what this stage read"]))
            plan[key] = ("submit", None)
        else:
            upstream = upstream_identity(stage, _finished_upstream(stage, stages))
            diff = stage_changes(stage, finished, _identity(stage, upstream))
            if diff:
                stale.append((stage.dir, diff))
            plan[key] = ("done", None)
    if stale:
        raise refusal(stale)
    return plan
