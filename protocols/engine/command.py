"""The command line of every protocol, parsed here once: its own options (`Command`: data and `build`), then
`--force [STAGE ...]`, `--status | --collect | --stage KEY`, `--launcher local|slurm [--wait] [--slurm.<key> V]`.
`build` makes the protocol's hooks (a `Run`: its stages, and what its runs do differently); `main` dispatches to
the engine: status rows, one stage (a cluster job's work), the table from finished stages, a SLURM submission, or
every stage here, under the run's lock (`<root>/.lock`; docs/cluster.md, docs/reruns.md)."""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

from jsonargparse import ActionConfigFile, ArgumentParser  # imported here: `command_errors` makes its errors one line

from protocols.engine.data_identity import rehash_files
from protocols.engine import cluster, local
from protocols.engine.progress import Progress
from protocols.engine.slurm_options import SlurmOptions, add_slurm_arguments, options_from_args
from protocols.engine.spec import StageSpec
from protocols.engine.status import print_status, stage_rows
from protocols.engine.run_files import OutDirLock, is_global_zero, read_json
from protocols.engine.stage_identity import ForceSpec, identity_changes

ONE_OF = ("status", "collect", "stage")


@dataclass
class Modes:
    """The shared flags: `mode` is "status", "collect", "stage", "submit" (--launcher slurm) or "run" (here); `stage`
    a stage's key (the mixture names a stage of one seed, and sets it); `argv`: recorded with what the run publishes."""

    force: ForceSpec
    slurm: SlurmOptions
    argv: list[str]
    mode: str = "run"
    stage: Optional[str] = None
    wait: bool = False


class Run:
    """The base of a protocol's hooks: the stages (`specs`, which it must give), and defaults for every hook whose
    usual answer needs nothing of the protocol. By default a stage's `StageSpec.stage` has `dir` (its folder) and
    `result_path` (its result file, written only when it finished); its output goes to `<dir>/stage.log`; a failure
    raises (nothing stands for an unfinished stage: no record, no stand-in, nothing blocked); a reused stage is
    taken as it is, and its identity compares by `identity_changes`. A protocol overrides only what differs."""

    workers = 1  # stages at once in a local run (the mixture's are subprocesses; W2S fits in this process)

    def where(self, spec: StageSpec) -> str:
        return spec.stage.dir

    def result_file(self, spec: StageSpec) -> str:
        return spec.stage.result_path

    def finished(self, spec: StageSpec) -> Optional[dict]:
        return read_json(self.result_file(spec))

    def recorded(self, spec: StageSpec) -> Optional[dict]:
        return None

    def missing(self, spec: StageSpec) -> Optional[dict]:
        return None

    def blocked(self, spec: StageSpec, upstream: dict[str, dict]) -> Optional[dict]:
        return None

    def changes(self, spec: StageSpec, finished: dict, identity: dict) -> list[str]:
        return identity_changes(finished, identity)

    def reuse(self, spec: StageSpec, finished: dict, identity: dict) -> dict:
        return finished

    def log_of(self, spec: StageSpec) -> Optional[str]:
        return os.path.join(self.where(spec), "stage.log")

    def specs(self, force: ForceSpec, only: Optional[set[str]] = None, planned: bool = False) -> list[StageSpec]:
        """Every stage, validated before any work (`only`: just these keys; `planned`: none, for `--status`)."""
        raise NotImplementedError

    def claim(self) -> None:
        """Before a run publishes (rank 0, under the run's lock): whether its table may be written there."""

    def between(self, previous: StageSpec, following: Optional[StageSpec]) -> None:
        """Between two stages of a sequential local run, and after its last (`following` None)."""

    def outcome(self, mode: str, value: Any, results: Optional[dict] = None) -> Any:
        """What the command returns: `value` is the status rows ("status", "submit"), the stage's result ("stage"),
        or what `hooks.publish` returned ("published", with each stage's result)."""
        return value


class Command(NamedTuple):
    """A protocol's command line: `doc` (its --help), `build(options, modes, error)` (its hooks, a `Run`, from its
    parsed options, or what to return when they ask for no run: the mixture's --list; `error` refuses an option),
    `options` (`((flags, ...), {keywords})` as `add_argument` takes them), `config` (a dataclass: jsonargparse)."""

    doc: str
    build: Callable[[dict, Modes, Callable[[str], Any]], Any]
    options: tuple = ()
    config: Optional[type] = None


def parse(command: Command, argv: Optional[list[str]] = None) -> tuple[dict, Modes, Callable[[str], Any]]:
    """(the protocol's own options, the shared flags, the parser's `error`)."""
    if command.config is None:
        parser = argparse.ArgumentParser(description=command.doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        parser = ArgumentParser(description=command.doc, default_config_files=[])
        parser.add_argument("--config", action=ActionConfigFile)
        parser.add_class_arguments(command.config, as_group=False)
    for flags, keywords in command.options:
        parser.add_argument(*flags, **keywords)
    parser.add_argument("--force", nargs="*", metavar="STAGE", help="rerun finished stages (their outputs deleted): "
                        "alone, every stage; with names (a stage, or its --status key), those and the stages reading "
                        "them. Give it after a positional argument")
    parser.add_argument("--launcher", choices=["local", "slurm"], default="local", help="local: every stage here; "
                        "slurm: each unfinished stage a SLURM job, then a job that writes the table (docs/cluster.md)")
    parser.add_argument("--status", action="store_true", help="each stage's state, job id and log, and exit")
    parser.add_argument("--collect", action="store_true", help="write the table from the finished stages and exit")
    parser.add_argument("--stage", help="run this one stage (its --status key): what a cluster job runs")
    parser.add_argument("--wait", action="store_true", help="with --launcher slurm: return when the jobs are done")
    add_slurm_arguments(parser)
    ns = parser.parse_args(argv)
    options = ns.as_dict() if hasattr(ns, "as_dict") else vars(ns)
    options.pop("config", None)
    options.update({f"slurm.{k}": v for k, v in options.pop("slurm", {}).items()})  # jsonargparse nests them
    flags = {k: options.pop(k) for k in ("force", "launcher", "wait", *ONE_OF)}
    if sum(bool(flags[m]) for m in ONE_OF) > 1:
        parser.error("give at most one of --status, --collect, --stage")
    try:
        slurm = options_from_args(options)
    except ValueError as err:
        parser.error(str(err))
    mode = next((m for m in ONE_OF if flags[m]), "submit" if flags["launcher"] == "slurm" else "run")
    modes = Modes(ForceSpec(flags["force"]), slurm, list(sys.argv[1:] if argv is None else argv), mode,
                  flags["stage"], flags["wait"])
    return options, modes, parser.error


def main(command: Command, argv: Optional[list[str]] = None) -> Any:
    """Parses the command line and does what it says; returns the protocol's `Run.outcome`."""
    options, modes, error = parse(command, argv)
    hooks = command.build(options, modes, error)
    if not isinstance(hooks, Run):
        return hooks  # the options asked for no run
    if modes.mode == "status":
        rows = status_rows(hooks)
        print_status(rows)
        return hooks.outcome("status", rows)
    if modes.force:  # a forced run trusts no cached file hash (a rewrite may have kept size and mtime: docs/reruns.md)
        rehash_files()
    if modes.mode == "stage":  # a cluster job's work: only the stage and what it reads are validated
        upstream = next((s.upstream for s in hooks.specs(modes.force, planned=True) if s.key == modes.stage), ())
        specs = hooks.specs(modes.force, only={modes.stage, *upstream})
        return hooks.outcome("stage", local.run_one(specs, hooks, modes.stage, modes.force))
    return run_all(hooks, modes)


def run_all(hooks: Run, modes: Modes) -> Any:
    """Under the run's lock, changed stages refused before any work: every stage here ("run"), each unfinished one a
    SLURM job ("submit"), or the table from the finished ones ("collect", or a submission that found all finished)."""
    mode, force = modes.mode, ForceSpec(None) if modes.mode == "collect" else modes.force
    specs = hooks.specs(force)
    if mode == "submit":
        hooks.python = modes.slurm.python  # the jobs' Python (each protocol's `job_command` reads it)
        cluster.preflight(specs, hooks, force, modes.slurm)
    jobs, rank0 = {}, is_global_zero()
    with OutDirLock(hooks.root) if rank0 else nullcontext():  # DDP children run inside rank 0's lock
        forced = local.refuse_changed(specs, hooks, force)
        if forced and rank0:
            print(f"--force: {len(forced)} finished stage(s) will run again: " + ", ".join(forced))
        if rank0:
            hooks.claim()
        if mode == "submit":
            jobs = cluster.submit(specs, hooks, force, modes.slurm)
        if mode == "run":
            results = local.run_local(specs, hooks, force, workers=hooks.workers, between=hooks.between,
                                      progress=Progress(specs, hooks, forced=len(forced)))
            hooks.between(specs[-1], None)
        elif not jobs:
            results = local.results_on_disk(specs, hooks)
        published = None if jobs else hooks.publish(specs, results)
    if mode != "submit":
        return hooks.outcome("published", published, results)
    if not jobs:  # every stage had finished: the table was written here, as a local run writes it
        hooks.outcome("published", published, results)
    elif modes.wait:
        cluster.wait(jobs, hooks)
    rows = status_rows(hooks)
    print_status(rows)
    return hooks.outcome("submit", rows)


def status_rows(hooks: Run, changed: Optional[Callable[[StageSpec, dict], list[str]]] = None) -> list[dict]:
    """Each stage and the collecting job (`status.stage_rows`). A finished stage that a rerun would refuse reads
    "changed" (`changed(spec, result)` replaces that check): its identity without the upstream part, only finished
    stages validated; when the configuration no longer parses, each finished stage says so."""
    specs = hooks.specs(ForceSpec(None), planned=True)
    finished = {s.key for s in specs if hooks.finished(s) is not None}
    if changed is None and finished:
        try:
            validated = {s.key: s for s in hooks.specs(ForceSpec(None), only=finished)}
            changed = lambda spec, done: local.changes_before_work(validated[spec.key], hooks, done)  # noqa: E731
        except ValueError as err:  # every finished stage reads as changed: a rerun refuses the configuration first
            message = str(err).splitlines()[0] if str(err) else "ValueError"
            changed = lambda spec, done: [f"the configuration no longer parses: {message}"]  # noqa: E731
    return stage_rows(specs, hooks, changed)
