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
`protocols.engine.stage_identity`, `protocols.engine.data_identity`); a re-run reuses a finished stage of the same identity, refuses
one of another identity (naming the differing keys or files) unless `--force` (every stage) or `--force <stage> ...`
names it, and a crash loses nothing already finished (docs/reruns.md). One run per out_dir at a time
(`<out_dir>/.lock`); under DDP every rank trains and tests, only global rank 0 writes (`protocols.engine.run_files`). The
tables, figures and TensorBoard summaries are published as one set, `<out_dir>/results/`, swapped in at once.
Several seeds per method are reported as mean ± std.

This file declares the protocol to the stage engine (`protocols.engine`): its stages (`w2s_stages.plan_stages`), its
hooks (`W2SHooks`: identity, reuse, what a stage runs, publishing, the job command) and its options (`COMMAND`: the
engine's command line, `protocols.engine.command`, parses them with the shared flags and runs the stages).
Configuration: `w2s_config`; validation: `w2s_validate`; what a stage runs: `w2s_fit`; the published set:
`w2s_publish`; the tables: `w2s_report`.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, fields
from typing import Any, Optional

from datamodules.atomic_files import atomic_write_json
from protocols.engine import cluster, command
from protocols.engine.quiet import output_to
from protocols.engine.spec import StageSpec
from protocols.engine.published_set import set_state
from protocols.engine.rank_errors import on_rank_zero
from protocols.engine.stage_identity import ForceSpec, StageChangedError  # noqa: F401 -- callers catch it from here
from protocols.w2s.teacher_search import TeacherSearch
from protocols.w2s.config import W2SProtocol
from protocols.w2s.methods import Method
from protocols.w2s.fit import checkpoint_step, release_stores, run_stage, run_test_stage  # noqa: F401 -- checkpoint_step: public
from protocols.w2s.publish import claim_results, publish_results, results_dir
from protocols.w2s.stages import (
    ceiling_results_path, clear_stage_dir, evaluated_stage, identity_of, plan_stages, stage_changes, stage_key,
    upstream_args, upstream_identity,
)
from protocols.w2s.validate import prepare


class W2SHooks(command.Run):
    """The W2S protocol's side of the stage engine. A stage is `seed<k>/<name>` in `<out_dir>/seed<k>/<name>/`, done
    when its `result.json` is there; a failure raises (the collecting job runs `afterok`); a stage's own output goes
    to its `stage.log` unless `verbose` (all `command.Run`'s defaults). Its stages are validated before any work (`prepare`), its table claimed
    before it is published (`replace_results`: over another configuration's set), a seed's stores freed after it."""

    label = "w2s"
    collect_after = "afterok"

    def __init__(self, p: W2SProtocol, verbose=False, argv: Optional[list[str]] = None, replace_results=False):
        self.p, self.verbose, self.command = p, verbose, argv  # argv: recorded with the published set
        self.root, self.replace_results = p.out_dir, replace_results
        self.python = ""  # the jobs' Python (`--slurm.python`), set by the engine before a submission
        self._snapshots: dict[int, str] = {}

    # ---- what the engine reads
    def specs(self, force: ForceSpec, only: Optional[set[str]] = None, planned: bool = False) -> list[StageSpec]:
        return [StageSpec(stage_key(s), s.seed, s.name, tuple(f"seed{s.seed}/{u}" for u in s.upstream), s)
                for s in (plan_stages(self.p) if planned else prepare(self.p, force, only))]

    def identity(self, spec: StageSpec, upstream: dict[str, dict]) -> dict:
        return identity_of(spec.stage, upstream_identity(spec.stage, _done(spec, upstream)) if upstream else {})

    def changes(self, spec: StageSpec, finished: dict, identity: dict) -> list[str]:
        return stage_changes(spec.stage, finished, identity)

    def table_state(self) -> tuple[str, str]:
        state, detail = set_state(results_dir(self.p))
        return os.path.join(results_dir(self.p), "results.json"), detail if state == "stale" else ""

    # ---- what the engine asks it to do
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
        job = cluster.collecting_job(self.root)  # the collecting job's table names the submitting command
        return publish_results(self.p, [s.stage for s in specs], done, job["command"][3:] if job else self.command)

    def claim(self) -> None:
        claim_results(self.p, self.replace_results)

    def between(self, previous: StageSpec, following: Optional[StageSpec]) -> None:
        if following is None or following.seed != previous.seed:  # a seed's data: its prefix hidden states go
            release_stores(previous.seed)

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
        base = [self.python or sys.executable, "-m", "protocols.w2s", "--config", snapshot]
        if key is None:
            return base + ["--collect"]
        return base + ["--stage", key, *(["--force", key] if rerun else [])]

    def job_name(self, key: str) -> str:
        return f"w2s:{os.path.basename(os.path.abspath(self.p.out_dir))}:{key}"

    def collect_record(self) -> dict:
        return {"command": ["python", "-m", "protocols.w2s", *(sys.argv[1:] if self.command is None else self.command)]}


def _done(spec: StageSpec, upstream: dict[str, dict]) -> dict[str, dict[int, dict]]:
    """Upstream results as the W2S stage functions read them: stage name -> seed -> result."""
    return {key.split("/", 1)[1]: {spec.seed: result} for key, result in upstream.items()}


def status(p: W2SProtocol, changed=None) -> list[dict]:
    """Each stage and the collecting job as `--status` shows them (`command.status_rows`)."""
    return command.status_rows(W2SHooks(p), changed)


def _protocol(options: dict) -> W2SProtocol:
    d = {f.name: options[f.name] for f in fields(W2SProtocol)}
    d["methods"] = [m if isinstance(m, Method) else Method(**m) for m in d["methods"]]
    if isinstance(d.get("teacher_search"), dict):
        d["teacher_search"] = TeacherSearch(**d["teacher_search"])
    return W2SProtocol(**d)


def _build(options: dict, modes: command.Modes, error) -> W2SHooks:
    p = _protocol(options)
    if modes.mode == "submit" and modes.slurm.world_size > 1:  # the stages' trainers span the job's processes
        extra = modes.slurm.trainer_args()  # (Lightning reads SLURM's environment); the jobs' snapshot has them
        p.teacher_args, p.student_args, p.zero_shot_args = (p.teacher_args + extra, p.student_args + extra,
                                                            p.zero_shot_args + extra)
    verbose = options["verbose"] or modes.mode == "stage"  # a job's own log is the stage's
    return W2SHooks(p, verbose, modes.argv, options["replace_results"])


COMMAND = command.Command(__doc__, _build, config=W2SProtocol, options=(
    (("--verbose",), dict(action="store_true", help="the stages' own output (Lightning's model summaries, progress "
                          "bars, warnings) on the terminal; by default each stage writes it to its stage.log and the "
                          "run prints one progress line per stage")),
    (("--replace_results",), dict(action="store_true", help="publish over a set that another configuration made in "
                                  "<out_dir>/<results_name> (it is withdrawn to <results_name>.stale/) instead of "
                                  "refusing")),
))


def parse(args: Optional[list[str]] = None) -> W2SProtocol:
    return _protocol(command.parse(COMMAND, args)[0])


def main(args: Optional[list[str]] = None) -> Any:
    """Runs the protocol as the flags say (`protocols.engine.command`): the results (a local run, --collect; --stage:
    that stage's result) or the status rows (--status, --launcher slurm)."""
    return command.main(COMMAND, args)

