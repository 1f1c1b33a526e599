"""Protocol stages as SLURM jobs (`--launcher slurm`, docs/cluster.md), for any protocol (`protocols.engine.cluster` plans them).

Each stage that is not finished becomes one `sbatch` job whose dependencies (`afterok`, with
`--kill-on-invalid-dep=yes`) are the jobs of its upstream stages; the job runs the protocol's own command for that
one stage (`--stage`), so the stage identity, the per-stage lock, the atomic writes and the reuse rules are the same
code as a local run. A last job (`--collect`) depends on every stage job and publishes the table.

Jobs are submitted with `sbatch` rather than submitit: the job script is a plain file a user can read and resubmit
by hand (like a stage's `commands.sh`), nothing is pickled across environments (the job re-parses the same config,
so a changed config is noticed, not run), and job states come from `squeue` — submitit reads them through `sacct`,
which needs an accounting database many clusters (and our test cluster) do not run, and without it a cancelled job
never reads as done. Each submitted job is recorded in `<out_dir>/.stages/<stage>/job.json`.

Every call to SLURM is bounded (`QUERY_TIMEOUT_S`): an unreachable controller makes its clients retry for a long
time, and `--status` must answer, saying SLURM could not be reached, rather than hang or call running jobs failed.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from datamodules.atomic_files import atomic_write
from protocols.engine.slurm_options import SlurmOptions, minutes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository: jobs import it
QUERY_TIMEOUT_S = 5.0  # one squeue / scontrol answer; a client that cannot reach the controller retries ~10 s
SUBMIT_TIMEOUT_S = 60.0  # one sbatch: the controller answered the check just before, so this is a slow one


# ---- bounded calls to SLURM ----------------------------------------------------------------------------------------
class SlurmUnreachable(RuntimeError):
    """SLURM's client commands are missing, or its controller did not answer."""


_NO_CONTROLLER = ("Unable to contact slurm controller", "Connection refused", "Socket timed out",
                  "Communication connection failure", "Zero Bytes were transmitted")


def _client(cmd: list[str], timeout: float = QUERY_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run one SLURM client command, at most `timeout` seconds; SlurmUnreachable when SLURM cannot answer."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmUnreachable(f"`{cmd[0]}` is not on PATH (run where SLURM's client commands are, or use "
                               "--launcher local)") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"`{' '.join(cmd[:3])} ...` had no answer in {timeout:.0f} s (is the controller up? "
                               f"SLURM_CONF={os.environ.get('SLURM_CONF', '(unset)')})") from None
    if out.returncode != 0 and any(s in out.stderr for s in _NO_CONTROLLER):
        raise SlurmUnreachable(f"{out.stderr.strip()} (SLURM_CONF={os.environ.get('SLURM_CONF', '(unset)')})")
    return out


@dataclass
class JobStates:
    """What one `squeue` call said of a set of jobs: their states (the jobs SLURM still remembers: queued, running,
    and ended ones for `MinJobAge` seconds), or why SLURM could not be asked."""

    states: dict[str, str] = field(default_factory=dict)
    unreachable: str = ""

    def of(self, job_id: str) -> Optional[str]:
        """PENDING / RUNNING / COMPLETED / FAILED / CANCELLED / ...; None when SLURM no longer knows the job (it
        ended more than MinJobAge seconds ago) or could not be asked."""
        return self.states.get(str(job_id))


def query_states(job_ids) -> JobStates:
    """The states of every job in one bounded `squeue -t all -j id,id,...` (`-t all` keeps the ended jobs SLURM
    still remembers, which `scontrol show job` would give one by one)."""
    ids = sorted({str(j) for j in job_ids if j}, key=lambda j: (len(j), j))
    if not ids:
        return JobStates()
    try:
        out = _client(["squeue", "-h", "-t", "all", "-o", "%i %T", "-j", ",".join(ids)])
    except SlurmUnreachable as err:
        return JobStates(unreachable=str(err))
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:  # every id asked is one SLURM forgot (or never had)
            return JobStates()
        return JobStates(unreachable=out.stderr.strip() or f"squeue exit code {out.returncode}")
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return JobStates(states)


def partition_limits() -> dict[str, dict]:
    """{partition: {"max_minutes": float (inf: unlimited), "default": bool}} from one bounded `scontrol show
    partition`; SlurmUnreachable when SLURM cannot answer."""
    out = _client(["scontrol", "-o", "show", "partition"])
    if out.returncode != 0:
        raise SlurmUnreachable(out.stderr.strip() or f"scontrol show partition: exit code {out.returncode}")
    found = {}
    for line in out.stdout.splitlines():
        fields = dict(t.split("=", 1) for t in line.split() if "=" in t)
        if "PartitionName" in fields:
            cap = minutes(fields.get("MaxTime", "UNLIMITED"))
            found[fields["PartitionName"]] = {"max_minutes": float("inf") if cap is None else cap,  # unreadable: no
                                              "default": fields.get("Default") == "YES"}  # refusal of ours
    return found


def check_cluster(opts: SlurmOptions) -> None:
    """Before anything is written or submitted: SLURM answers, the partition exists, and each time limit asked fits
    its MaxTime (a partition refuses a job over it, or, without `EnforcePartLimits`, leaves it pending forever)."""
    try:
        parts = partition_limits()
    except SlurmUnreachable as err:
        raise RuntimeError(f"--launcher slurm: SLURM could not be reached, nothing was submitted: {err}") from None
    asked = [p for p in opts.partition.split(",") if p] or [p for p, v in parts.items() if v["default"]]
    unknown = [p for p in asked if p not in parts]
    if unknown or not asked:
        raise RuntimeError(f"--slurm.partition {opts.partition!r}: " + (f"no partition {unknown}" if unknown else
                           "the cluster has no default partition") + f"; this cluster has {sorted(parts)}")
    for flag in ("time", "collect_time"):
        limit = getattr(opts, flag)
        if not limit:
            continue
        if all(minutes(limit) > parts[p]["max_minutes"] for p in asked):  # a list: it may run in any of them
            caps = ", ".join(f"{p} ({_hms(parts[p]['max_minutes'])})" for p in asked)
            raise RuntimeError(
                f"--slurm.{flag} {limit} is over the MaxTime of partition {caps}: nothing was submitted. Give "
                f"--slurm.{flag} within it (or leave it empty for the partition's default), or a partition that "
                f"allows it with --slurm.partition (this cluster: "
                + ", ".join(f"{p} {_hms(v['max_minutes'])}" for p, v in sorted(parts.items())) + ")")


def _hms(mins: float) -> str:
    if mins == float("inf"):
        return "UNLIMITED"
    secs = round(mins * 60)
    return f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"


# ---- jobs ------------------------------------------------------------------------------------------------------
COLLECT = "collect"  # the status row and job folder of a protocol's collecting job
IN_FLIGHT = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "STAGE_OUT",
             "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SIGNALING", "STOPPED"}
UNREACHABLE = "unknown (SLURM unreachable)"


def job_script(command: list[str], cwd: str, opts: SlurmOptions, srun: bool) -> str:
    """The batch script: the site's setup lines, then the protocol's command (under `srun` for a stage, so each of
    its tasks gets SLURM's environment, which Lightning reads for DDP)."""
    run = " ".join(shlex.quote(c) for c in command)
    lines = ["#!/bin/bash", "set -euo pipefail", f"cd {shlex.quote(cwd)}", *opts.setup,
             'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
             f'export PYTHONPATH={shlex.quote(ROOT)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
             f"exec srun --kill-on-bad-exit=1 {run}" if srun else f"exec {run}"]
    return "\n".join(lines) + "\n"


def dependency_flags(after: dict[str, list[str]]) -> list[str]:
    """`--dependency=afterok:1:2,afterany:3` (every condition must hold) and `--kill-on-invalid-dep=yes`, so a job
    whose upstream failed is cancelled instead of pending forever; none without dependencies."""
    conds = [f"{kind}:{':'.join(ids)}" for kind, ids in after.items() if ids]
    return [f"--dependency={','.join(conds)}", "--kill-on-invalid-dep=yes"] if conds else []


def read_job(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class Submission:
    """The jobs and files of one submitting call, undone together when it fails partway: its jobs are cancelled
    (one `scancel`), the files it wrote get their old content (and time) back, the folders it made go. Without
    this a refusal of the collecting job left the stage jobs queued with no job to write the table."""

    def __init__(self) -> None:
        self.jobs: list[str] = []
        self.logs: list[str] = []
        self._files: list[tuple[str, Optional[tuple[bytes, float, float]]]] = []  # path, (old bytes, atime, mtime)
        self._dirs: list[str] = []

    def makedirs(self, folder: str) -> None:
        missing = []
        while folder and not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for d in reversed(missing):
            os.makedirs(d, exist_ok=True)
            self._dirs.append(d)

    def write(self, path: str, text: str) -> None:
        self.makedirs(os.path.dirname(path))
        old = None
        if os.path.isfile(path):
            st = os.stat(path)
            with open(path, "rb") as f:
                old = (f.read(), st.st_atime, st.st_mtime)
        self._files.append((path, old))
        atomic_write(path, text)

    def __enter__(self) -> "Submission":
        return self

    def __exit__(self, kind, err, tb) -> bool:
        if err is None:
            return False
        note = self._undo()
        if isinstance(err, Exception):
            raise RuntimeError(f"{err}\n{note}") from err
        print(note, file=sys.stderr)  # KeyboardInterrupt / SystemExit: undone, then let it through
        return False

    def _undo(self) -> str:
        cancelled = ""
        if self.jobs:
            try:
                out = _client(["scancel", *self.jobs])
                cancelled = "" if out.returncode == 0 else out.stderr.strip() or f"exit code {out.returncode}"
            except SlurmUnreachable as err:
                cancelled = str(err)
        for path, old in reversed(self._files):
            if old is None:
                _remove(path)
            else:
                with open(path, "wb") as f:
                    f.write(old[0])
                os.utime(path, (old[1], old[2]))  # the record's time says which table is newer (collect_row)
        for log in self.logs:
            _remove(log)  # a job that started before its scancel
        for d in reversed(self._dirs):
            try:
                os.rmdir(d)
            except OSError:
                pass  # not empty: something else wrote there meanwhile
        ids = " ".join(self.jobs)
        if not self.jobs:
            return "Nothing was submitted; the files this submission wrote were removed."
        if cancelled:
            return (f"These {len(self.jobs)} job(s) of this submission may stay queued (scancel failed: {cancelled}); "
                    f"cancel them with: scancel {ids}")
        return (f"Cancelled the {len(self.jobs)} job(s) this submission had queued (scancel {ids}) and removed the "
                "files it wrote: nothing of it stays queued.")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def sbatch(script_path: str, name: str, log: str, flags: list[str]) -> str:
    """`sbatch` the script; returns its job id."""
    cmd = ["sbatch", "--parsable", f"--job-name={name}", f"--output={log}", *flags, script_path]
    shown = " ".join(shlex.quote(c) for c in cmd)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=SUBMIT_TIMEOUT_S)
    except FileNotFoundError:
        raise RuntimeError("--launcher slurm: `sbatch` is not on PATH (run where SLURM's client commands are, or "
                           "use --launcher local)") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"sbatch had no answer in {SUBMIT_TIMEOUT_S:.0f} s for the job {name!r}; it may have been "
                           f"queued all the same (squeue -n {shlex.quote(name)})\ncommand: {shown}") from None
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"sbatch refused the job {name!r}: {err.stderr.strip() or err.stdout.strip()}\n"
                           f"command: {shown}") from None
    return out.stdout.strip().split(";")[0]


def submit_stage_job(sub: Submission, folder: str, log_dir: str, key: str, name: str, command: list[str],
                     opts: SlurmOptions, after: dict[str, list[str]], collect: bool = False,
                     extra: Optional[dict] = None) -> str:
    """Submit one protocol job (a stage under `srun`, or the collecting job) after the jobs of `after`
    ({"afterok": ids, "afterany": ids}) and record it in `<folder>/job.json` (with `extra` fields), its script in
    `<folder>/job.sh`, its log in `<log_dir>/<key>-<job id>.out`."""
    log = os.path.join(log_dir, key.replace("/", "-") + "-%j.out")
    script = os.path.join(folder, "job.sh")
    sub.makedirs(log_dir)  # before sbatch: the job may start at once, and SLURM opens its log there
    sub.write(script, job_script(command, os.getcwd(), opts, srun=not collect))
    job_id = sbatch(script, name, log, opts.sbatch_flags(collect=collect) + dependency_flags(after))
    sub.jobs.append(job_id)
    sub.logs.append(log.replace("%j", job_id))
    record = {"job_id": job_id, "log": log.replace("%j", job_id), "script": script, "submitted": time.time(),
              **(extra or {})}
    sub.write(os.path.join(folder, "job.json"), json.dumps(record, indent=2) + "\n")
    return job_id


def submit_collect(sub: Submission, folder: str, log_dir: str, name: str, command: list[str], opts: SlurmOptions,
                   after: dict[str, list[str]], states: JobStates, extra: Optional[dict] = None) -> str:
    """The collecting job, one per out_dir. A collecting job of an earlier submission still in flight is followed
    (`afterany`: the two never hold the out_dir's lock at once), and cancelled when it is still queued: the new one
    runs the latest submission's command after every job in flight, so resubmitting while jobs wait leaves one
    collecting job, not an orphan racing the recorded one. The old one is cancelled only once the new one is
    queued: a refusal in between leaves it as it was."""
    old = read_job(os.path.join(folder, "job.json"))
    old_state = states.of(old["job_id"]) if old else None
    follow = [old["job_id"]] if old_state in IN_FLIGHT else []
    after = {**after, "afterany": sorted({*after.get("afterany", []), *follow})}
    job_id = submit_stage_job(sub, folder, log_dir, COLLECT, name, command, opts, after, collect=True, extra=extra)
    if old_state == "PENDING":  # a failure here undoes nothing: the new one waits for the old one either way
        try:
            out = _client(["scancel", old["job_id"]])
            why = out.stderr.strip() if out.returncode != 0 else ""
        except SlurmUnreachable as err:
            why = str(err)
        if why:
            print(f"warning: could not cancel the earlier collecting job {old['job_id']} ({why}); the new one "
                  f"({job_id}) runs after it", file=sys.stderr)
    return job_id


def wait_for(job_ids: list[str], timeout: float = 3600.0, poll: float = 2.0) -> dict[str, str]:
    """Block until none of the jobs is queued or running (tests and `--wait`): one `squeue` per poll; returns their
    final states (UNKNOWN: SLURM forgot the job). An unreachable SLURM is waited out until `timeout`."""
    deadline = time.time() + timeout
    while True:
        answer = query_states(job_ids)
        states = {j: answer.of(j) or "UNKNOWN" for j in job_ids}
        if not answer.unreachable and not any(s in IN_FLIGHT for s in states.values()):
            return states
        if time.time() > deadline:
            raise TimeoutError(f"jobs still in flight after {timeout:.0f} s: "
                               f"{answer.unreachable or states}")
        time.sleep(poll)
