"""`--slurm.*`: the resources and site settings of a protocol's SLURM jobs (docs/cluster.md), and SLURM's time
limits as it reads them."""
from __future__ import annotations

import dataclasses
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Optional

@dataclass
class SlurmOptions:
    """Resources and site settings of the stage jobs (`--slurm.*`).

    Args:
        partition: `--partition` (empty: the cluster's default; a comma list: any of them).
        nodes: nodes per stage; > 1 runs Lightning DDP across nodes through its SLURM environment (the stage's
            trainer gets `--trainer.num_nodes`, `--trainer.devices` = `ntasks_per_node`, `--trainer.strategy ddp`).
        gpus_per_node: GPUs per node (`--gpus-per-node`; 0: none asked).
        ntasks_per_node: processes per node, one per device (default: `gpus_per_node`, at least 1).
        cpus_per_task: CPU cores per process (`OMP_NUM_THREADS` follows it).
        mem: memory per node (`--mem`, e.g. "64G"; empty: the partition's default).
        time: wall-time limit per stage job (`--time`, e.g. "04:00:00"; empty: the partition's default time). Checked
            against the partition's MaxTime before anything is submitted.
        collect_time: wall-time limit of the collecting job (empty: the partition's default time).
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
    time: str = ""  # no limit of ours: a fixed default (it was 4 h) is refused by partitions with a shorter MaxTime
    collect_time: str = ""
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
        for flag in ("time", "collect_time"):
            setattr(self, flag, str(getattr(self, flag) or "").strip())  # a YAML `time:` with no value is None
            if getattr(self, flag) and minutes(getattr(self, flag)) is None:
                raise ValueError(f"--slurm.{flag} {getattr(self, flag)!r} is no SLURM time limit: give minutes, "
                                 "[HH:]MM:SS or D-HH[:MM[:SS]], e.g. 00:20:00, or leave it empty for the "
                                 "partition's default")

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
        limit = self.collect_time if collect else self.time
        flags = [f"--time={limit}"] if limit else []
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


def minutes(limit: str) -> Optional[float]:
    """A SLURM time limit in minutes ("30", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS"); infinity for
    UNLIMITED / INFINITE; None when it is no time limit."""
    limit = limit.strip()
    if limit.upper() in ("UNLIMITED", "INFINITE"):
        return float("inf")
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", limit)
    if not match:
        return None
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        parts = [int(days) * 24 + int(a), int(b or 0), int(c or 0)]
    elif c is not None:  # HH:MM:SS
        parts = [int(a), int(b), int(c)]
    elif b is not None:  # MM:SS
        parts = [0, int(a), int(b)]
    else:  # minutes
        parts = [0, int(a), 0]
    return parts[0] * 60 + parts[1] + parts[2] / 60


def add_slurm_arguments(parser) -> None:
    """`--slurm.<field>` for every field of `SlurmOptions`, on a protocol's parser (argparse or jsonargparse alike).
    A list field takes a JSON list (`--slurm.extra='["--hold"]'`) or one item (given again: argparse adds the
    items, jsonargparse keeps the last)."""
    hints = typing.get_type_hints(SlurmOptions)
    for f in dataclasses.fields(SlurmOptions):
        if hints[f.name] == list[str]:
            parser.add_argument(f"--slurm.{f.name}", dest=f"slurm.{f.name}", action="append", default=[],
                                help="a JSON list or one item")
        else:
            kind = {int: int, Optional[int]: lambda v: None if v in (None, "null", "None") else int(v)}
            parser.add_argument(f"--slurm.{f.name}", dest=f"slurm.{f.name}", type=kind.get(hints[f.name], str),
                                default=f.default)


def options_from_args(options: dict) -> SlurmOptions:
    """The `SlurmOptions` of a parsed command line (its `slurm.<field>` entries, taken out of `options`)."""
    values = {f.name: options.pop(f"slurm.{f.name}") for f in dataclasses.fields(SlurmOptions)}
    for name, value in values.items():
        if isinstance(value, list):  # each item as given: a JSON list of items, or one item
            values[name] = [x for item in value for x in (json.loads(item) if item.startswith("[") else [item])]
    return SlurmOptions(**values)
