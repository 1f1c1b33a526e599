"""Every unfinished stage of a protocol as a SLURM job (`--launcher slurm`, docs/cluster.md): after the jobs of the
stages it reads (`afterok`), then one collecting job that publishes the table after all of them (`afterok` or
`afterany`: the protocol's `collect_after`). A job runs the protocol's own command for its one stage (`--stage`),
so identities, locks, reuse and atomic writes are the local run's code (`protocols.engine.local`).

Before anything is written or submitted: SLURM answers and the time limits fit the partition, and the plan refuses
finished stages of another identity as a local run would. A submission refused partway cancels what it queued and
removes what it wrote (`slurm_jobs.Submission`). A stage whose job is queued or running is left to it.
"""
from __future__ import annotations

import os
from typing import Optional

from protocols.engine import slurm_jobs
from protocols.engine.spec import Hooks, StageSpec, stage_folder
from protocols.engine.slurm_options import SlurmOptions
from protocols.engine.stage_identity import ForceSpec, refusal


def preflight(specs: list[StageSpec], hooks: Hooks, force: ForceSpec, opts: SlurmOptions) -> None:
    """Before the run's lock (which makes its folder) or anything else is written: when some stage must run, SLURM
    answers and the time limits fit the partition (a run finished on disk needs no SLURM)."""
    if _must_run(specs, hooks, force):
        slurm_jobs.check_cluster(opts)


def _must_run(specs: list[StageSpec], hooks: Hooks, force: ForceSpec) -> bool:
    return any(hooks.finished(s) is None or force.forces(s.name, s.seed) for s in specs)


def submit(specs: list[StageSpec], hooks: Hooks, force: ForceSpec, opts: SlurmOptions) -> dict[str, str]:
    """Submit what must run; returns key -> job id of every stage job in flight after it (none: every stage had
    finished, and the caller publishes the table here). The caller ran `preflight` and holds the run's lock."""
    to_run = _must_run(specs, hooks, force)
    states = recorded_states(specs, hooks)
    if states.unreachable and to_run:
        raise RuntimeError(f"--launcher slurm: SLURM could not be reached, nothing was submitted: {states.unreachable}")
    plan = _plan(specs, hooks, force, states)
    jobs = {key: job for key, (action, job) in plan.items() if action == "in_flight"}
    if jobs or any(action == "submit" for action, _ in plan.values()):
        with slurm_jobs.Submission() as sub:
            _submit_all(sub, specs, hooks, plan, jobs, opts, states)
    return jobs


def recorded_states(specs: list[StageSpec], hooks: Hooks) -> slurm_jobs.JobStates:
    """The states of every recorded job of these stages and of the collecting job: one bounded `squeue`."""
    paths = [_job_path(hooks.root, key) for key in [*(s.key for s in specs), slurm_jobs.COLLECT]]
    jobs = [slurm_jobs.read_job(p) for p in paths]
    return slurm_jobs.query_states([j["job_id"] for j in jobs if j])


def collecting_job(root: str) -> Optional[dict]:
    """The record of the collecting job of `root` when this process is that job (`SLURM_JOB_ID`), else None: the
    table it writes then names the command that submitted it (recorded with the job), not its own `--collect`."""
    job = slurm_jobs.read_job(_job_path(root, slurm_jobs.COLLECT)) or {}
    return job if job.get("command") and os.environ.get("SLURM_JOB_ID") == str(job["job_id"]) else None


def _job_path(root: str, key: str) -> str:
    return os.path.join(stage_folder(root, key), "job.json")


def _plan(specs: list[StageSpec], hooks: Hooks, force: ForceSpec,
          states: slurm_jobs.JobStates) -> dict[str, tuple[str, Optional[str]]]:
    """key -> ("done" | "in_flight" | "submit", job id). A finished stage whose upstream will run again follows it
    when that upstream is forced (or follows a forced one); otherwise it is refused, as a local run would refuse it
    once the upstream ran."""
    plan: dict[str, tuple[str, Optional[str]]] = {}
    rerun: set[str] = set()  # keys that run again because they, or an upstream, were forced
    finished: dict[str, dict] = {}
    stale = []
    for spec in specs:
        job = slurm_jobs.read_job(_job_path(hooks.root, spec.key))
        if job and states.of(job["job_id"]) in slurm_jobs.IN_FLIGHT:
            plan[spec.key] = ("in_flight", job["job_id"])
            continue
        forced = force.forces(spec.name, spec.seed) or any(u in rerun for u in spec.upstream)
        result = hooks.finished(spec)
        if forced:
            rerun.add(spec.key)
            plan[spec.key] = ("submit", None)
        elif result is None:
            plan[spec.key] = ("submit", None)
        elif any(plan[u][0] != "done" for u in spec.upstream):
            waiting = ", ".join(u for u in spec.upstream if plan[u][0] != "done")
            stale.append((hooks.where(spec), [f"upstream: {waiting} will run again (unfinished), which changes what "
                                              "this stage read"]))
            plan[spec.key] = ("submit", None)
        else:
            diff = hooks.changes(spec, result, hooks.identity(spec, {u: finished[u] for u in spec.upstream}))
            if diff:
                stale.append((hooks.where(spec), diff))
            finished[spec.key] = result
            plan[spec.key] = ("done", None)
    if stale:
        raise refusal(stale)
    return plan


def _submit_all(sub: slurm_jobs.Submission, specs: list[StageSpec], hooks: Hooks, plan: dict, jobs: dict[str, str],
                opts: SlurmOptions, states: slurm_jobs.JobStates) -> None:
    """Each stage to run after its upstream stages' jobs, then the collecting job after every job in flight;
    `jobs` gains the new ones."""
    logs = os.path.join(hooks.root, "logs")
    for spec in specs:
        if plan[spec.key][0] != "submit":
            continue
        after = [jobs[u] for u in spec.upstream if u in jobs]
        order = [jobs[u] for u in spec.after if u in jobs and u not in spec.upstream]  # whatever their outcome
        command = hooks.job_command(spec.key, hooks.finished(spec) is not None, sub)
        jobs[spec.key] = slurm_jobs.submit_stage_job(sub, stage_folder(hooks.root, spec.key), logs, spec.key,
                                                     hooks.job_name(spec.key), command, opts,
                                                     {"afterok": after, "afterany": order})
    slurm_jobs.submit_collect(sub, stage_folder(hooks.root, slurm_jobs.COLLECT), logs,
                              hooks.job_name(slurm_jobs.COLLECT), hooks.job_command(None, False, sub), opts,
                              {hooks.collect_after: sorted(set(jobs.values()))}, states, extra=hooks.collect_record())


def wait(jobs: dict[str, str], hooks: Hooks) -> None:
    """Until the stage jobs and the collecting job are no longer queued or running (`--wait`)."""
    collect = slurm_jobs.read_job(_job_path(hooks.root, slurm_jobs.COLLECT))
    slurm_jobs.wait_for(sorted(set(jobs.values())) + ([collect["job_id"]] if collect else []))
