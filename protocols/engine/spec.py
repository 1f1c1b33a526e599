"""What a protocol declares to the engine: its stages (`StageSpec`) and what only it knows (`Hooks`)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Protocol


@dataclass
class StageSpec:
    """One stage of a protocol, as the engine sees it.

    `key` names it everywhere: its folder under `<root>/.stages/` (lock, job record), its `--stage` value, its
    `--force` and status row (`seed0/teacher` for W2S, `seed_0/sft` for the mixture: the protocol's own shape).
    `upstream`: the keys of the stages whose results it reads; they come before it in the declared order.
    `after`: keys of stages that must be settled before it starts although it reads nothing of theirs (order only:
    the mixture's stages of one seed share a working directory and checkpoint paths). Not part of its identity.
    `stage`: the protocol's own description of it (what its hooks need); the engine never looks inside.
    """

    key: str
    seed: int
    name: str
    upstream: tuple[str, ...] = ()
    stage: Any = None
    after: tuple[str, ...] = ()


class Hooks(Protocol):
    """What differs between protocols, passed in (never a branch in the engine).

    Attributes:
        root: the folder holding the run's lock (`.lock`), the stages' locks and job records (`.stages/`) and the
            cluster logs (`logs/`).
        label: the protocol's name in job names and status titles ("w2s", "mixture").
        collect_after: the collecting job's dependency on the stage jobs: "afterok" (a failed stage fails the
            table: W2S raises) or "afterany" (the table reports whatever happened: the mixture records a failure
            and goes on).
    """

    root: str
    label: str
    collect_after: str

    def where(self, spec: StageSpec) -> str:
        """The stage's folder, for messages."""

    def finished(self, spec: StageSpec) -> Optional[dict]:
        """The stage's complete result on disk, or None (never ran, failed, or lost an output)."""

    def result_file(self, spec: StageSpec) -> str:
        """The file that holds the stage's result (or record): what a published set records of the stage, by its
        real path, and what a rerun of the stage withdraws every set reading (`local.withdraw_readers`). Optional:
        a protocol without it gets only the sets of its own root that name the stage's key withdrawn."""

    def blocked(self, spec: StageSpec, upstream: dict[str, dict]) -> Optional[dict]:
        """A result standing for a stage that cannot run because of what its upstream results say (the mixture's
        "skipped" when its start stage failed), or None."""

    def identity(self, spec: StageSpec, upstream: dict[str, dict]) -> dict:
        """What the stage's result depends on; `upstream`: key -> result of each upstream stage ({} before any
        work: the identity without its `upstream` part is compared then)."""

    def changes(self, spec: StageSpec, finished: dict, identity: dict) -> list[str]:
        """How a finished result's recorded identity differs from `identity` ([] when it is the same stage)."""

    def reuse(self, spec: StageSpec, finished: dict, identity: dict) -> dict:
        """What a reused stage returns (it may refresh its record); called under the stage's lock."""

    def run(self, spec: StageSpec, upstream: dict[str, dict], identity: dict, forced: bool) -> dict:
        """Run the stage (clearing its old outputs first) and return its result; called under its lock."""

    def recorded(self, spec: StageSpec) -> Optional[dict]:
        """A stage's record whatever its outcome (the mixture's failed stages), or None (W2S records only results)."""

    def missing(self, spec: StageSpec) -> Optional[dict]:
        """What the table shows for a stage with no record (`--collect`): None when nothing may stand for it (W2S:
        the collection is refused), or the protocol's stand-in (the mixture reports a run that did not finish)."""

    def publish(self, specs: list[StageSpec], results: dict[str, dict]) -> Any:
        """Write the protocol's tables from every stage's result."""

    def job_command(self, key: Optional[str], rerun: bool, submission: Any) -> list[str]:
        """The command a cluster job runs: one stage (`key`; `rerun`: it must run again although finished), or the
        collecting job (`key` None). `submission` (`slurm_jobs.Submission`): where the protocol writes what its jobs
        read (W2S: a snapshot of its configuration), so a refused submission removes it."""

    def job_name(self, key: str) -> str:
        """The SLURM job name of a stage (or of the collecting job, `slurm_jobs.COLLECT`)."""

    def collect_record(self) -> dict:
        """Fields recorded with the collecting job (e.g. the submitting command, which its table then names)."""

    def log_of(self, spec: StageSpec) -> Optional[str]:
        """The stage's own log file, if it has one (shown by `--status`)."""

    def table_state(self) -> tuple[str, str]:
        """(the published table's path, why it is stale or ""), for the collecting job's status row."""


def stage_folder(root: str, key: str) -> str:
    """`<root>/.stages/<key>`: the stage's lock and job record, outside the stage folder that a rerun deletes."""
    return os.path.join(root, ".stages", key)
