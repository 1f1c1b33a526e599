"""Protocol stages as SLURM jobs (`--launcher slurm`, docs/cluster.md), shared by both protocols.

Each stage that is not finished becomes one `sbatch` job whose dependencies (`afterok`, with
`--kill-on-invalid-dep=yes`) are the jobs of its upstream stages; the job runs the protocol's own command for that
one stage (`--stage`), so the stage identity, the per-stage lock, the atomic writes and the reuse rules are the same
code as a local run. A last job (`--collect`) depends on every stage job and publishes the table.

Jobs are submitted with `sbatch` rather than submitit: the job script is a plain file a user can read and resubmit
by hand (like a stage's `commands.sh`), nothing is pickled across environments (the job re-parses the same config,
so a changed config is noticed, not run), and job states come from `squeue` / `scontrol` — submitit reads them
through `sacct`, which needs an accounting database many clusters (and our test cluster) do not run, and without it
a cancelled job never reads as done. Each submitted job is recorded in `<out_dir>/.stages/<stage>/job.json`.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from typing import Optional

from datamodules.atomic_files import atomic_write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: the jobs import from it


@dataclass
class SlurmOptions:
    """Resources and site settings of the stage jobs (`--slurm.*`).

    Args:
        partition: `--partition` (empty: the cluster's default).
        nodes: nodes per stage; > 1 runs Lightning DDP across nodes through its SLURM environment (the stage's
            trainer gets `--trainer.num_nodes`, `--trainer.devices` = `ntasks_per_node`, `--trainer.strategy ddp`).
        gpus_per_node: GPUs per node (`--gpus-per-node`; 0: none asked).
        ntasks_per_node: processes per node, one per device (default: `gpus_per_node`, at least 1).
        cpus_per_task: CPU cores per process (`OMP_NUM_THREADS` follows it).
        mem: memory per node (`--mem`, e.g. "64G"; empty: the partition's default).
        time: wall-time limit per stage job (`--time`, e.g. "04:00:00").
        collect_time: wall-time limit of the collecting job.
        account: `--account` (empty: none).
        qos: `--qos` (empty: none).
        extra: more `sbatch` flags, as given (e.g. ["--constraint=a100", "--exclusive"]).
        setup: shell lines run before the protocol in each job (e.g. ["module load cuda/12.4",
            "source .venv/bin/activate"]).
        python: the Python that runs the jobs (empty: the one submitting them).
    """

    partition: str = ""
    nodes: int = 1
    gpus_per_node: int = 0
    ntasks_per_node: Optional[int] = None
    cpus_per_task: int = 1
    mem: str = ""
    time: str = "04:00:00"
    collect_time: str = "00:30:00"
    account: str = ""
    qos: str = ""
    extra: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    python: str = ""

    def __post_init__(self) -> None:
        for flag in ("nodes", "cpus_per_task"):
            if not isinstance(getattr(self, flag), int) or getattr(self, flag) < 1:
                raise ValueError(f"--slurm.{flag} must be an integer >= 1, got {getattr(self, flag)!r}")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise ValueError(f"--slurm.gpus_per_node must be an integer >= 0, got {self.gpus_per_node!r}")
        if self.ntasks_per_node is None:
            self.ntasks_per_node = max(1, self.gpus_per_node)
        if self.ntasks_per_node < 1:
            raise ValueError(f"--slurm.ntasks_per_node must be >= 1, got {self.ntasks_per_node}")
        if self.gpus_per_node and self.ntasks_per_node != self.gpus_per_node:
            raise ValueError(f"--slurm.ntasks_per_node ({self.ntasks_per_node}) must equal --slurm.gpus_per_node "
                             f"({self.gpus_per_node}): Lightning runs one process per device")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node

    def trainer_args(self) -> list[str]:
        """What a stage's trainer needs to span the job's processes (none for one process)."""
        if self.world_size == 1:
            return []
        return [f"--trainer.num_nodes={self.nodes}", f"--trainer.devices={self.ntasks_per_node}",
                "--trainer.strategy=ddp"]

    def sbatch_flags(self, collect: bool = False) -> list[str]:
        """The job's resources: a stage gets the nodes and tasks; the collecting job one task of one core."""
        flags = [f"--time={self.collect_time if collect else self.time}"]
        if not collect:
            flags += [f"--nodes={self.nodes}", f"--ntasks-per-node={self.ntasks_per_node}",
                      f"--cpus-per-task={self.cpus_per_task}"]
            if self.gpus_per_node:
                flags.append(f"--gpus-per-node={self.gpus_per_node}")
            if self.mem:
                flags.append(f"--mem={self.mem}")
        else:
            flags += ["--nodes=1", "--ntasks=1", "--cpus-per-task=1"]
        for flag in ("partition", "account", "qos"):
            if getattr(self, flag):
                flags.append(f"--{flag}={getattr(self, flag)}")
        return flags + list(self.extra)


# ---- jobs ------------------------------------------------------------------------------------------------------
COLLECT = "collect"  # the status row and job folder of a protocol's collecting job
IN_FLIGHT = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "STAGE_OUT"}


def job_script(command: list[str], cwd: str, opts: SlurmOptions, srun: bool) -> str:
    """The batch script: the site's setup lines, then the protocol's command (under `srun` for a stage, so each of
    its tasks gets SLURM's environment, which Lightning reads for DDP)."""
    run = " ".join(shlex.quote(c) for c in command)
    lines = ["#!/bin/bash", "set -euo pipefail", f"cd {shlex.quote(cwd)}", *opts.setup,
             'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
             f'export PYTHONPATH={shlex.quote(ROOT)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
             f"exec srun --kill-on-bad-exit=1 {run}" if srun else f"exec {run}"]
    return "\n".join(lines) + "\n"


def submit(script: str, script_path: str, name: str, log: str, flags: list[str], after: list[str],
           dependency: str = "afterok") -> str:
    """`sbatch` the script (written to `script_path`) once every job of `after` succeeded (`afterok`) or ended in any
    way (`afterany`); returns its job id."""
    os.makedirs(os.path.dirname(script_path), exist_ok=True)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(script_path, "w") as f:
        f.write(script)
    cmd = ["sbatch", "--parsable", f"--job-name={name}", f"--output={log}", *flags]
    if after:
        cmd += [f"--dependency={dependency}:{':'.join(after)}", "--kill-on-invalid-dep=yes"]
    try:
        out = subprocess.run(cmd + [script_path], capture_output=True, text=True, check=True, timeout=120)
    except FileNotFoundError:
        raise RuntimeError("--launcher slurm: `sbatch` is not on PATH (run where SLURM's client commands are, or "
                           "use --launcher local)") from None
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"sbatch refused the job {name!r}: {err.stderr.strip() or err.stdout.strip()}\n"
                           f"command: {' '.join(shlex.quote(c) for c in cmd + [script_path])}") from None
    return out.stdout.strip().split(";")[0]


def job_state(job_id: str) -> str:
    """PENDING / RUNNING / COMPLETED / FAILED / CANCELLED / TIMEOUT / ... of a job, from `squeue` (queued and
    running jobs) or `scontrol show job` (finished ones, for `MinJobAge` seconds); UNKNOWN once SLURM forgot it."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return "UNKNOWN"
    for token in out.stdout.split():
        if token.startswith("JobState="):
            return token.split("=", 1)[1]
    return "UNKNOWN"


def record_job(path: str, job_id: str, log: str, script: str) -> None:
    atomic_write_json({"job_id": job_id, "log": log, "script": script, "submitted": time.time()}, path)


def read_job(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def wait_for(job_ids: list[str], timeout: float = 3600.0, poll: float = 2.0) -> dict[str, str]:
    """Block until none of the jobs is queued or running (tests and `--wait`); returns their final states."""
    deadline = time.time() + timeout
    while True:
        states = {j: job_state(j) for j in job_ids}
        if not any(s in IN_FLIGHT for s in states.values()):
            return states
        if time.time() > deadline:
            raise TimeoutError(f"jobs still in flight after {timeout:.0f} s: {states}")
        time.sleep(poll)


def submit_stage_job(folder: str, log_dir: str, key: str, name: str, command: list[str], opts: SlurmOptions,
                     after: list[str], collect: bool = False, dependency: str = "afterok") -> str:
    """Submit one protocol job (a stage under `srun`, or the collecting job) and record it in `<folder>/job.json`,
    its script in `<folder>/job.sh`, its log in `<log_dir>/<key>-<job id>.out`."""
    log = os.path.join(log_dir, key.replace("/", "-") + "-%j.out")
    script = os.path.join(folder, "job.sh")
    job_id = submit(job_script(command, os.getcwd(), opts, srun=not collect), script, name, log,
                    opts.sbatch_flags(collect=collect), after, dependency)
    record_job(os.path.join(folder, "job.json"), job_id, log.replace("%j", job_id), script)
    return job_id


def state_of(job: Optional[dict], finished: bool) -> str:
    """A stage's state for `--status`: done when its result is there, else its job's (queued / running / failed)."""
    if finished:
        return "done"
    if not job:
        return "not started"
    state = job_state(job["job_id"])
    if state == "PENDING":
        return "queued"
    if state in IN_FLIGHT:
        return "running"
    return "failed (COMPLETED without a result)" if state == "COMPLETED" else f"failed ({state})"


def collect_row(job_path: str, published: bool) -> dict:
    """The status row of a protocol's collecting job: done when the table is published and no newer collecting job
    is still to run (or the table was written without a job), else its job's state."""
    job = read_job(job_path)
    finished = published and (not job or job_state(job["job_id"]) == "COMPLETED")
    return {"stage": COLLECT, "state": state_of(job, finished), "job_id": (job or {}).get("job_id"),
            "log": (job or {}).get("log")}


def status_table(rows: list[dict]) -> str:
    """Markdown table of stages: name, state, job id, log."""
    lines = ["| stage | state | job | log |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['state']} | {r.get('job_id') or ''} | {r.get('log') or ''} |")
    return "\n".join(lines)


def print_status(rows: list[dict]) -> None:
    """The status table, then a count per state."""
    print(status_table(rows))
    counts: dict[str, int] = {}
    for r in rows:
        state = r["state"].split(" (")[0]
        counts[state] = counts.get(state, 0) + 1
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))


def add_slurm_arguments(parser) -> None:
    """`--slurm.<field>` for every field of `SlurmOptions`, on an argparse parser (the mixture protocol's; the W2S
    protocol's jsonargparse parser takes the dataclass itself)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(SlurmOptions)
    for f in dataclasses.fields(SlurmOptions):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = hints[f.name]
        if kind == list[str]:
            parser.add_argument(f"--slurm.{f.name}", dest=f"slurm_{f.name}", action="append", default=default,
                                help="repeatable")
        else:
            conv = int if kind in (int, Optional[int]) else str
            parser.add_argument(f"--slurm.{f.name}", dest=f"slurm_{f.name}", type=conv, default=default)


def options_from_args(args) -> SlurmOptions:
    import dataclasses

    return SlurmOptions(**{f.name: getattr(args, f"slurm_{f.name}") for f in dataclasses.fields(SlurmOptions)})
