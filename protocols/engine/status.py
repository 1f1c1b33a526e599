"""`--status`: each stage of a protocol as done / running / queued / failed / not started, from what is on disk,
the stage locks a local run holds, and one bounded question to SLURM for every recorded job."""
from __future__ import annotations

import json
import os
from typing import Optional

from protocols.engine.slurm_jobs import COLLECT, IN_FLIGHT, UNREACHABLE, JobStates, query_states, read_job
from protocols.engine.spec import stage_folder

# ---- --status ---------------------------------------------------------------------------------------------------
def state_of(job: Optional[dict], finished: bool, states: JobStates) -> str:
    """A row's state for `--status`. A job still queued or running comes first (a stage finished on disk with a job
    in flight is being run again, a table with one is being rewritten); then what is on disk: done whatever SLURM
    remembers; then the job's end (failed with SLURM's state, or forgotten), or "unknown" when SLURM could not be
    asked."""
    state = states.of(job["job_id"]) if job else None
    if state in IN_FLIGHT:
        return "queued" if state == "PENDING" else "running"
    if finished:
        return "done"
    if not job:
        return "not started"
    if states.unreachable:
        return UNREACHABLE
    if state is None:
        return f"failed (job {job['job_id']} ended without a result; SLURM no longer remembers how)"
    return "failed (COMPLETED without a result)" if state == "COMPLETED" else f"failed ({state})"


def job_row(key: str, job: Optional[dict], state: str, states: JobStates, log: Optional[str] = None) -> dict:
    """A status row; its log is the job's, else `log` (the stage's own), and only a file that exists (a job that
    never ran has none)."""
    logs = [path for path in ((job or {}).get("log"), log) if path and os.path.isfile(path)]
    row = {"stage": key, "state": state, "job_id": (job or {}).get("job_id"), "log": logs[0] if logs else None}
    if state == UNREACHABLE:
        row["note"] = states.unreachable
    return row


def collect_row(job_path: str, table_path: str, states: JobStates) -> dict:
    """The status row of a protocol's collecting job: done when the table on disk is newer than the recorded job
    (that job, or a local run after it, wrote it), whatever SLURM remembers, unless that job is still queued or
    running; an older table is a previous run's, and the row is the recorded job's end. Both times are the file
    system's own (mtimes), so clocks of other hosts do not matter."""
    job = read_job(job_path)
    table = _mtime(table_path)
    finished = table is not None and (job is None or table >= (_mtime(job_path) or 0.0))
    return job_row(COLLECT, job, state_of(job, finished, states), states)


def _mtime(path: str) -> Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def print_status(rows: list[dict]) -> None:
    """The status table (stage, state, job id, log), a count per state, and a line saying so when SLURM could not
    be reached."""
    print("| stage | state | job | log |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['stage']} | {r['state']} | {r.get('job_id') or ''} | {r.get('log') or ''} |")
    counts: dict[str, int] = {}
    for r in rows:
        state = r["state"].split(" (")[0]
        counts[state] = counts.get(state, 0) + 1
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    unknown = [r for r in rows if r["state"] == UNREACHABLE]
    if unknown:
        print(f"SLURM unreachable: the state of {len(unknown)} job(s) is unknown ({unknown[0]['note']}); what is "
              "finished on disk reads as done. Check SLURM_CONF and `scontrol ping`, then ask --status again.")


# ---- the rows of a protocol --------------------------------------------------------------------------------------
def stage_rows(specs, hooks, changed=None) -> list[dict]:
    """Each stage and the collecting job as a status row, for a local run as for a cluster run: done (on disk),
    running (a job, or a local run holding the stage's lock), queued, failed, not started. `changed(spec, result)`:
    what a rerun would refuse of a finished stage, shown as "changed (...)" instead of done. The table's row is
    "stale" when the published set no longer stands for its stages (`hooks.table_state`)."""
    jobs = {s.key: read_job(os.path.join(stage_folder(hooks.root, s.key), "job.json")) for s in specs}
    collect_job = os.path.join(stage_folder(hooks.root, COLLECT), "job.json")
    ids = [j["job_id"] for j in [*jobs.values(), read_job(collect_job)] if j]
    states = query_states(ids) if ids else JobStates()
    rows = []
    records: dict[str, Optional[dict]] = {}  # what each stage left, finished or not (for its downstream's row)
    for spec in specs:
        job, result = jobs[spec.key], hooks.finished(spec)
        records[spec.key] = result or hooks.recorded(spec)
        state = state_of(job, result is not None, states)
        holder = lock_holder(stage_folder(hooks.root, spec.key))
        if holder and state not in ("queued", "running"):
            child = f", its fit PID {holder['child']}" if holder.get("child") else ""
            state = f"running (PID {holder.get('pid', '?')} on {holder.get('host', '?')}{child})"
        elif result is None and state not in ("queued", "running"):
            state = _unfinished_state(spec, hooks, records, state)
        diff = _changes(changed, spec, result) if changed and state == "done" else []
        if diff:
            state = f"changed (a rerun refuses it: {diff[0][:100]}; --force {spec.key} reruns it)"
        rows.append(job_row(spec.key, job, state, states, log=hooks.log_of(spec)))
    table, stale = hooks.table_state()
    row = collect_row(collect_job, table, states)
    changed_keys = [r["stage"] for r in rows if r["state"].startswith("changed")]
    if not stale and changed_keys:  # the table stands for stages that a rerun would not reuse
        stale = f"{', '.join(changed_keys[:3])}{' ...' if len(changed_keys) > 3 else ''} changed since"
    if stale and row["state"] in ("done", "not started"):  # not started: a table withdrawn (its note says why)
        row["state"] = f"stale ({stale})"
    rows.append(row)
    return rows


def _changes(changed, spec, result) -> list[str]:
    """`changed(spec, result)`, or the reason it cannot be told (a configuration that no longer parses is a change
    a rerun refuses, never "done")."""
    try:
        return changed(spec, result)
    except (ValueError, TypeError, OSError) as err:
        return [f"its configuration no longer parses: {str(err).splitlines()[0] if str(err) else type(err).__name__}"]


def _unfinished_state(spec, hooks, records: dict, state: str) -> str:
    """A stage without a result: its recorded failure (the mixture records one, with its error), or skipped when
    the protocol stands in for it because of its upstream records (`hooks.blocked`), else `state` as it was."""
    record = records[spec.key]
    if record and record.get("status") == "failed":
        return f"failed ({str(record.get('error', ''))[:80]})"
    if record is None and spec.upstream:
        blocked = hooks.blocked(spec, {u: records[u] for u in spec.upstream if records.get(u) is not None})
        if blocked is not None:
            return f"{blocked.get('status', 'skipped')} ({blocked.get('error', '')})"
    return state


def lock_holder(folder: str) -> Optional[dict]:
    """The holder ({"pid", "host"}) of the lock in `folder` when a process holds it, else None. Read from the
    kernel's table of locks (/proc/locks), not by trying the lock: a `--status` must never make a starting stage
    find its lock taken."""
    path = os.path.join(folder, ".lock")
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks") as f:
            table = f.read()
    except OSError:
        return None
    held = any(parts[1] == "FLOCK" and parts[-3].rsplit(":", 1)[-1] == str(inode)
               for parts in (line.split() for line in table.splitlines()) if len(parts) >= 8)
    if not held:
        return None
    try:
        with open(path) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
