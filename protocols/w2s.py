"""The weak-to-strong protocol in one command (docs/w2s.md):

    teacher (gold, teacher half) -> soft labels on the student half -> ceiling (gold, student half)
    -> every student method -> ID/OOD tests -> results.json / results.csv / results.md + TensorBoard figures

An outside reward model (`hf_classifier:<dir or hub id>`, docs/export.md) can be the teacher without fitting
(`teacher_pretrained`: its stage is a `cli.py test` only, and the students learn from its labels), and outside
models can be tested as zero-shot rows beside the students (`zero_shot`).

    python -m protocols.w2s --config configs/experiment/w2s_synthetic.yaml [--force [STAGE ...]]

Every stage is an ordinary `cli.py fit` + `cli.py test` (its command lines are written to the stage folder, so any
stage can be re-run by hand). Before any training, every stage of every seed and method is parsed with `cli.py`'s
parser and validated. A stage writes `result.json` atomically when it is complete, with its identity (resolved
configuration, checkpoint choice, upstream stages, the contents of the data files it reads:
`protocols.stage_identity`, `protocols.data_identity`); a re-run reuses a finished stage of the same identity, refuses
one of another identity (naming the differing keys or files) unless `--force` (every stage) or `--force <stage> ...`
names it, and a crash loses nothing already finished (docs/reruns.md). One run per out_dir at a time
(`<out_dir>/.lock`); under DDP every rank trains and tests, only global rank 0 writes (`protocols.run_files`). The
tables, figures and TensorBoard summaries are published as one set, `<out_dir>/results/`, swapped in at once.
Several seeds per method are reported as mean ± std.

This file declares the protocol to the stage engine (`protocols.engine`): its stages (`w2s_stages.plan_stages`) and
its hooks (`W2SHooks`: identity, reuse, what a stage runs, publishing, the job command), and holds its command line.
Configuration: `w2s_config`; validation: `w2s_validate`; what a stage runs: `w2s_fit`; the published set:
`w2s_publish`; the tables: `w2s_report`.
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from typing import Any, Optional

from jsonargparse import ActionConfigFile, ArgumentParser

from datamodules.atomic_files import atomic_write_json
from protocols.engine import cluster, local, status as engine_status
from protocols.engine.progress import Progress
from protocols.engine.quiet import output_to
from protocols.engine.slurm_jobs import COLLECT
from protocols.engine.slurm_options import SlurmOptions
from protocols.engine.status import print_status
from protocols.engine.spec import StageSpec
from protocols.published_set import set_state
from protocols.rank_errors import on_rank_zero
from protocols.run_files import OutDirLock, is_global_zero, read_json
from protocols.stage_identity import StageChangedError  # noqa: F401 -- callers catch it from here
from protocols.stage_identity import ForceSpec
from protocols.teacher_search import TeacherSearch
from protocols.w2s_config import Method, W2SProtocol
from protocols.w2s_fit import checkpoint_step, release_stores, run_stage, run_test_stage  # noqa: F401 -- checkpoint_step: public
from protocols.w2s_publish import claim_results, publish_results, results_dir
from protocols.w2s_stages import (
    Stage, ceiling_results_path, clear_stage_dir, evaluated_stage, identity_of, plan_stages, stage_changes, stage_key,
    upstream_args, upstream_identity,
)
from protocols.w2s_validate import prepare


class W2SHooks:
    """The W2S protocol's side of the stage engine. A stage is `seed<k>/<name>` in `<out_dir>/seed<k>/<name>/`, done
    when its `result.json` is there; a failure raises (the collecting job runs `afterok`); a stage's own output goes
    to its `stage.log` unless `verbose`."""

    label = "w2s"
    collect_after = "afterok"

    def __init__(self, p: W2SProtocol, verbose: bool = False, command: Optional[list[str]] = None):
        self.p, self.verbose, self.command = p, verbose, command
        self.root = p.out_dir
        self.python = ""  # the jobs' Python (`--slurm.python`), set by `submit`
        self._snapshots: dict[int, str] = {}

    # ---- what the engine reads
    def where(self, spec: StageSpec) -> str:
        return spec.stage.dir

    def finished(self, spec: StageSpec) -> Optional[dict]:
        return read_json(spec.stage.result_path)

    def result_file(self, spec: StageSpec) -> str:
        return spec.stage.result_path

    def recorded(self, spec: StageSpec) -> Optional[dict]:
        return None  # a W2S stage records its result only when it finished

    def missing(self, spec: StageSpec) -> Optional[dict]:
        return None  # an unfinished stage has no row: --collect refuses, naming it

    def blocked(self, spec: StageSpec, upstream: dict[str, dict]) -> Optional[dict]:
        return None  # a failed W2S stage raises: nothing downstream is reached

    def identity(self, spec: StageSpec, upstream: dict[str, dict]) -> dict:
        return identity_of(spec.stage, upstream_identity(spec.stage, _done(spec, upstream)) if upstream else {})

    def changes(self, spec: StageSpec, finished: dict, identity: dict) -> list[str]:
        return stage_changes(spec.stage, finished, identity)

    def log_of(self, spec: StageSpec) -> Optional[str]:
        return os.path.join(spec.stage.dir, "stage.log")

    def table_state(self) -> tuple[str, str]:
        state, detail = set_state(results_dir(self.p))
        return os.path.join(results_dir(self.p), "results.json"), detail if state == "stale" else ""

    # ---- what the engine asks it to do
    def reuse(self, spec: StageSpec, finished: dict, identity: dict) -> dict:
        local.sweep(spec.stage.dir)  # a dead writer's temps in a folder this run reads
        return finished

    def run(self, spec: StageSpec, upstream: dict[str, dict], identity: dict, forced: bool) -> dict:
        stage, done = spec.stage, _done(spec, upstream)
        on_rank_zero(f"clear {stage.dir}", clear_stage_dir, stage.dir)  # the engine withdrew the sets reading it
        evaluated = evaluated_stage(stage, done) if stage.evaluates else None
        args = stage.args + upstream_args(stage, done, evaluated)
        with output_to(None if self.verbose else os.path.join(stage.dir, "stage.log")):
            if stage.pretrained or stage.evaluates or stage.combine:
                members = [done[n][stage.seed]["checkpoint"] for n in stage.members]
                result = run_test_stage(stage, args, identity, evaluated, members)
            else:
                result = run_stage(stage, args, identity)
        if stage.name == "ceiling":  # the methods' --model.ceiling_results
            on_rank_zero(f"write the ceiling results of {stage.dir}", atomic_write_json,
                         {k: v for k, v in result["test"].items() if k != "transfer"}, ceiling_results_path(stage))
        return result

    def publish(self, specs: list[StageSpec], results: dict[str, dict]) -> dict:
        done: dict[str, dict[int, dict]] = {}
        for spec in specs:
            done.setdefault(spec.name, {})[spec.seed] = results[spec.key]
        return publish_results(self.p, [s.stage for s in specs], done, self.command)

    # ---- cluster jobs
    def job_command(self, key: Optional[str], rerun: bool, submission) -> list[str]:
        """`python -m protocols.w2s --config <snapshot> --stage KEY [--force KEY]` (or `--collect`): the jobs read a
        snapshot of the configuration written at submission, so a later edit of the config cannot reach them."""
        snapshot = self._snapshots.get(id(submission))
        if snapshot is None:
            now = time.time()  # to the microsecond: two submissions within a second must not share one
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now * 1e6) % 1_000_000:06d}"
            snapshot = os.path.join(self.p.out_dir, ".stages", f"protocol-{stamp}-{os.getpid()}.json")
            submission.write(snapshot, json.dumps(asdict(self.p), indent=2) + "\n")
            self._snapshots[id(submission)] = snapshot
        command = [self.python or sys.executable, "-m", "protocols.w2s", "--config", snapshot]
        if key is None:
            return command + ["--collect"]
        return command + ["--stage", key, *(["--force", key] if rerun else [])]

    def job_name(self, key: str) -> str:
        return f"w2s:{os.path.basename(os.path.abspath(self.p.out_dir))}:{key}"

    def collect_record(self) -> dict:
        return {"command": ["python", "-m", "protocols.w2s", *(sys.argv[1:] if self.command is None else self.command)]}


def _done(spec: StageSpec, upstream: dict[str, dict]) -> dict[str, dict[int, dict]]:
    """Upstream results as the W2S stage functions read them: stage name -> seed -> result."""
    return {key.split("/", 1)[1]: {spec.seed: result} for key, result in upstream.items()}


def specs_of(stages: list[Stage]) -> list[StageSpec]:
    return [StageSpec(stage_key(s), s.seed, s.name, tuple(f"seed{s.seed}/{u}" for u in s.upstream), s)
            for s in stages]


def run_protocol(p: W2SProtocol, force: Optional[ForceSpec] = None, replace_results: bool = False,
                 command: Optional[list[str]] = None, verbose: bool = False) -> dict:
    """Every stage in this process (`--launcher local`), then the results; returns the results (every rank computes
    the same ones). `replace_results`: publish over a set another configuration made (it is withdrawn first).
    `command`: the protocol's arguments, recorded with the published set. `verbose`: the stages' own output (model
    summaries, progress bars) on the terminal instead of in each stage's `stage.log`."""
    force = force or ForceSpec(None)
    specs = specs_of(prepare(p, force))
    hooks = W2SHooks(p, verbose, command)
    rank0 = is_global_zero()
    with OutDirLock(p.out_dir) if rank0 else nullcontext():  # DDP children run inside rank 0's lock
        forced = local.refuse_changed(specs, hooks, force)
        if forced and rank0:
            print(f"--force: {len(forced)} finished stage(s) will run again: " + ", ".join(forced))
        if rank0:
            claim_results(p, replace_results)
        results = local.run_local(specs, hooks, force, progress=Progress(specs, hooks, forced=len(forced)),
                                  between=_between_seeds)
        release_stores(specs[-1].seed)
        return hooks.publish(specs, results)


def _between_seeds(previous: StageSpec, following: StageSpec) -> None:
    if following.seed != previous.seed:  # a seed's data: its prefix hidden states are not reused
        release_stores(previous.seed)


def run_one_stage(p: W2SProtocol, key: str, force: ForceSpec, verbose: bool = False) -> dict:
    """One stage (a cluster job's work), from its finished upstream stages' results on disk, under its own lock;
    only it and what it reads are validated."""
    planned = {stage_key(s): s for s in plan_stages(p)}
    if key not in planned:
        raise ValueError(f"--stage {key!r}: no such stage; the stages are {list(planned)}")
    upstream = {f"seed{planned[key].seed}/{u}" for u in planned[key].upstream}
    specs = specs_of(prepare(p, force, only={key, *upstream}))
    return local.run_one(specs, W2SHooks(p, verbose), key, force)


def collect(p: W2SProtocol, command: Optional[list[str]] = None) -> dict:
    """The table from every stage's finished result (refused, naming them, while any is unfinished or changed)."""
    specs = specs_of(prepare(p, ForceSpec(None)))
    hooks = W2SHooks(p, command=command)
    with OutDirLock(p.out_dir) if is_global_zero() else nullcontext():
        local.refuse_changed(specs, hooks, ForceSpec(None))
        results = local.results_on_disk(specs, hooks)
        if is_global_zero():
            claim_results(p, replace=False)
        return hooks.publish(specs, results)


def status(p: W2SProtocol, changed=None) -> list[dict]:
    """Each stage and the collecting job: done / running (a job or a local run's lock) / queued / failed / not
    started, changed (a finished stage a rerun would refuse: its configuration or data changed; `changed(spec,
    result)` replaces that check), and the table's row (stale when its stages changed)."""
    hooks = W2SHooks(p)
    specs = specs_of(plan_stages(p))
    return engine_status.stage_rows(specs, hooks, changed or _changed_check(p, specs, hooks))


def _changed_check(p: W2SProtocol, specs: list[StageSpec], hooks: W2SHooks):
    """What a rerun would refuse of each finished stage, before any work: its identity without the upstream part
    (only the finished stages are parsed); when the configuration no longer parses, each finished stage says so.
    None when no stage finished."""
    finished = {s.key for s in specs if hooks.finished(s) is not None}
    if not finished:
        return None
    try:
        validated = {stage_key(s): s for s in prepare(p, ForceSpec(None), only=finished)}
    except ValueError as err:  # every finished stage reads as changed: a rerun refuses the configuration first
        message = str(err).splitlines()[0] if str(err) else "ValueError"
        return lambda spec, result: [f"the configuration no longer parses: {message}"]

    def changed(spec: StageSpec, result: dict) -> list[str]:
        validated_spec = StageSpec(spec.key, spec.seed, spec.name, spec.upstream, validated[spec.key])
        return local.changes_before_work(validated_spec, hooks, result)
    return changed


def submit(p: W2SProtocol, force: ForceSpec, opts: SlurmOptions, wait: bool = False) -> list[dict]:
    """Every stage that is not finished (or is forced) as a SLURM job, then the collecting job (`engine.cluster`);
    returns the status rows. With every stage finished the table is written here."""
    if opts.world_size > 1:  # the stages' trainers span the job's processes (Lightning reads SLURM's environment)
        extra = opts.trainer_args()
        p.teacher_args, p.student_args, p.zero_shot_args = (p.teacher_args + extra, p.student_args + extra,
                                                            p.zero_shot_args + extra)
    specs = specs_of(prepare(p, force))
    hooks = W2SHooks(p)
    hooks.python = opts.python
    cluster.preflight(specs, hooks, force, opts)
    with OutDirLock(p.out_dir):
        local.refuse_changed(specs, hooks, force)
        claim_results(p, replace=False)
        jobs = cluster.submit(specs, hooks, force, opts)
    if not jobs:  # every stage finished: the table now, as a local run writes it
        collect(p)
    elif wait:
        cluster.wait(jobs, hooks)
    return status(p)


def _parse(args: Optional[list[str]]) -> tuple[W2SProtocol, ForceSpec, dict]:
    parser = ArgumentParser(description=__doc__, default_config_files=[])
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(W2SProtocol, as_group=False)
    parser.add_argument("--force", nargs="*", default=None,
                        help="rerun finished stages instead of reusing or refusing them (their old outputs are "
                             "deleted): alone, every stage; with names (teacher, ceiling, a method; seed<k>/<name> "
                             "for one seed), those stages, and the stages that read them follow")
    parser.add_argument("--launcher", choices=["local", "slurm"], default="local",
                        help="local: every stage in this process, one after another; slurm: each unfinished stage "
                             "as a SLURM job after its upstream stages' jobs, then a job that writes the table "
                             "(docs/cluster.md)")
    parser.add_class_arguments(SlurmOptions, "slurm")
    parser.add_argument("--status", action="store_true", help="list each stage as done / queued / running / failed "
                                                              "/ not started, with its job id and log, and exit")
    parser.add_argument("--collect", action="store_true", help="write the table from the finished stages and exit")
    parser.add_argument("--stage", default=None, help="run this one stage (seed<k>/<name>), from its upstream "
                                                      "stages' results: what a cluster job runs")
    parser.add_argument("--wait", action="store_true", help="with --launcher slurm: return when the jobs are done")
    parser.add_argument("--verbose", action="store_true",
                        help="the stages' own output (Lightning's model summaries, progress bars, warnings) on the "
                             "terminal; by default each stage writes it to its stage.log and the run prints one "
                             "progress line per stage")
    parser.add_argument("--replace_results", action="store_true",
                        help="publish over a set that another configuration made in <out_dir>/<results_name> (it is "
                             "withdrawn to <results_name>.stale/) instead of refusing")
    ns = parser.parse_args(args)
    d = ns.as_dict()
    d.pop("config", None)
    force = ForceSpec(d.pop("force"))
    modes = {k: d.pop(k) for k in ("launcher", "status", "collect", "stage", "wait", "replace_results", "verbose")}
    modes["slurm"] = SlurmOptions(**d.pop("slurm"))
    if sum(bool(modes[k]) for k in ("status", "collect", "stage")) > 1:
        parser.error("give at most one of --status, --collect, --stage")
    d["methods"] = [m if isinstance(m, Method) else Method(**m) for m in d["methods"]]
    if isinstance(d.get("teacher_search"), dict):
        d["teacher_search"] = TeacherSearch(**d["teacher_search"])
    return W2SProtocol(**d), force, modes


def parse(args: Optional[list[str]] = None) -> W2SProtocol:
    return _parse(args)[0]


def main(args: Optional[list[str]] = None) -> Any:
    """Runs the protocol as the flags say: the results (local, --collect, --stage: that stage's result) or the
    status rows (--status, --launcher slurm)."""
    protocol, force, modes = _parse(args)
    if modes["status"]:
        rows = status(protocol)
        print_status(rows)
        return rows
    if modes["collect"]:
        return collect(protocol, command=_collect_command(protocol))
    if modes["stage"]:
        return run_one_stage(protocol, modes["stage"], force, verbose=True)  # a job's own log is the stage's
    if modes["launcher"] == "slurm":
        rows = submit(protocol, force, modes["slurm"], wait=modes["wait"])
        print_status(rows)
        return rows
    return run_protocol(protocol, force=force, replace_results=modes["replace_results"], command=args,
                        verbose=modes["verbose"])


def _collect_command(p: W2SProtocol) -> Optional[list[str]]:
    """In the collecting job, the command that submitted it (recorded with the job), so the set names the run, not
    its own `--collect` call."""
    from protocols.engine.slurm_jobs import read_job
    from protocols.engine.spec import stage_folder

    job = read_job(os.path.join(stage_folder(p.out_dir, COLLECT), "job.json")) or {}
    if os.environ.get("SLURM_JOB_ID") and job.get("job_id") == os.environ["SLURM_JOB_ID"] and job.get("command"):
        return job["command"][3:]  # after "python -m protocols.w2s"
    return None


if __name__ == "__main__":
    from protocols.refusals import run_main

    run_main(main)
