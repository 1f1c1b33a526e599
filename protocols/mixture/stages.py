"""The mixture protocol's stages (one `cli.py fit` subprocess each, in `<out>/<family>/seed_<k>/`) and its side of
the stage engine (`MixtureHooks`): a stage is `seed_<k>/<name>`, done when its record says so and its checkpoint
(and table) are there; a stage that fails is a recorded result (its error), the stages that start from it are
skipped, and the report shows both (the collecting job runs `afterany`)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from protocols.engine import children, command
from protocols.engine.cluster import collecting_job
from protocols.engine.spec import StageSpec
from protocols.engine.published_set import stage_entry
from protocols.engine.stage_identity import digest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


INIT_KEY = "model.init_args.init_checkpoint"


@dataclass(frozen=True)
class Stage:
    """One `cli.py fit` run. `start`: the stage whose checkpoint it starts from (None: from scratch). `sft`: an SFT
    stage (gets --sft-set; reported by its stop step and fidelity) rather than RL (--set; persona table)."""
    name: str
    config: str
    title: str
    extra: tuple[str, ...] = ()
    start: Optional[str] = "sft"
    sft: bool = False


@dataclass(frozen=True)
class Experiment:
    family: str  # directory under --out; experiments of one family share stages (by identity)
    stages: tuple[Stage, ...]
    summary: str = ""  # what the table is about
    question_fixtures: bool = False  # ARC / RACE: generate hub-schema question files and pass --data.question_dirs


class MixtureHooks(command.Run):
    """One experiment's run: its stages of every seed, the extra `cli.py` arguments (`--set`, `--sft-set`), the
    threads per stage, the generated question folders, and the report's name."""

    label = "mixture"
    collect_after = "afterany"

    def __init__(self, exp_name: str, exp: Experiment, stages: list[Stage], seeds: list[int], out: str, extra: dict,
                 threads: int, question_dirs: Optional[dict], report: str, command: str):
        self.exp_name, self.exp, self.stages, self.seeds, self.out = exp_name, exp, stages, seeds, out
        self.extra, self.threads, self.question_dirs, self.report, self.command = (extra, threads, question_dirs,
                                                                                   report, command)
        self.root = os.path.join(out, exp.family)
        self.start = time.time()
        self.python = ""  # the jobs' Python (`--slurm.python`)
        self._resolved: dict[tuple, tuple[dict, dict]] = {}

    def specs(self) -> list[StageSpec]:
        """Every stage of every seed; a seed's stages one after another (`after`: the previous one), since they
        share the seed's folder and their configs' checkpoint paths (the full-sequence and persona-token variants
        of one config write the same file), while seeds run in parallel."""
        return [StageSpec(f"seed_{seed}/{s.name}", seed, s.name, (f"seed_{seed}/{s.start}",) if s.start else (), s,
                          (f"seed_{seed}/{self.stages[i - 1].name}",) if i else ())
                for seed in self.seeds for i, s in enumerate(self.stages)]

    # ---- what the engine reads
    def seed_dir(self, spec: StageSpec) -> str:
        return os.path.join(self.root, f"seed_{spec.seed}")

    def record(self, spec: StageSpec) -> str:
        return record_path(self.out, self.exp, spec.seed, spec.name)

    def where(self, spec: StageSpec) -> str:
        return os.path.join(self.seed_dir(spec), spec.name)

    def finished(self, spec: StageSpec) -> Optional[dict]:
        return finished_record(self.record(spec))

    def result_file(self, spec: StageSpec) -> str:
        return self.record(spec)

    def recorded(self, spec: StageSpec) -> Optional[dict]:
        """The stage's record whatever its status: the report shows a failure with its error."""
        return _read(self.record(spec))

    def missing(self, spec: StageSpec) -> Optional[dict]:
        return {"status": "failed", "error": "no record: its run did not finish (see --status)"}

    def blocked(self, spec: StageSpec, upstream: dict[str, dict]) -> Optional[dict]:
        start = upstream.get(spec.upstream[0]) if spec.upstream else None
        if spec.upstream and (start is None or start.get("status") != "done"):
            return skipped(spec.stage)
        return None

    def identity(self, spec: StageSpec, upstream: dict[str, dict]) -> dict:
        return self._resolve(spec, upstream)[0]

    def _resolve(self, spec: StageSpec, upstream: dict[str, dict]) -> tuple[dict, dict]:
        """(identity, resolved config), parsed once per stage and upstream run."""
        run = _run_of(upstream[spec.upstream[0]]) if spec.upstream and upstream else None
        if (spec.key, run) not in self._resolved:
            self._resolved[spec.key, run] = identity_of(spec.stage, self._args(spec), run, self.seed_dir(spec))
        return self._resolved[spec.key, run]

    def _args(self, spec: StageSpec) -> list[str]:
        extra = self.extra.get("sft" if spec.stage.sft else "rl", [])
        return stage_args(spec.stage, spec.seed, extra, self.question_dirs)

    def log_of(self, spec: StageSpec) -> Optional[str]:
        return os.path.join(self.seed_dir(spec), "stages", f"{spec.name}.log")

    def table_state(self) -> tuple[str, str]:
        from protocols.engine.published_set import set_state

        state, detail = set_state(os.path.join(self.root, f"{self.report}_results"))
        return os.path.join(self.root, f"{self.report}_results", "results.json"), detail if state == "stale" else ""

    # ---- what the engine asks it to do
    def reuse(self, spec: StageSpec, finished: dict, identity: dict) -> dict:
        key = digest(identity)
        if finished.get("digest") != key:  # options added at their defaults: the same run, under today's identity
            finished = dict(finished, identity=identity, digest=key, run=_run_of(finished))
            _write_json(self.record(spec), finished)
        return finished

    def run(self, spec: StageSpec, upstream: dict[str, dict], identity: dict, forced: bool) -> dict:
        seed_dir = self.seed_dir(spec)
        os.makedirs(os.path.join(seed_dir, "stages"), exist_ok=True)
        _, config = self._resolve(spec, upstream)
        args = self._args(spec)
        if spec.upstream:
            args.append(f"--model.init_checkpoint={upstream[spec.upstream[0]]['checkpoint']}")
        # SHIFTGEN_TRACEBACK: the stage's log is the run's log; it keeps the child's traceback above its error line
        env = dict(os.environ, **OFFLINE, OMP_NUM_THREADS=str(self.threads), PYTHONPATH=ROOT, SHIFTGEN_TRACEBACK="1")
        return _run(spec.stage, args, identity, checkpoint_of(spec.stage, seed_dir, config), seed_dir, env,
                    self.record(spec), spec.seed)

    def publish(self, specs: list[StageSpec], results: dict[str, dict]) -> str:
        from protocols.mixture.report import write_report

        records = {seed: {s.name: results[s.key] for s in specs if s.seed == seed} for seed in self.seeds}
        command, wall_s = collected_run(self.root) or (self.command, time.time() - self.start)
        read = {s.key: stage_entry(self.root, self.record(s), results[s.key]) for s in specs
                if results[s.key].get("status") == "done"}  # the set's stages: a rerun of one withdraws it
        return write_report(self.root, self.report, self.exp, self.stages, records, wall_s, command=command,
                            stages_read=read, threads=self.threads)

    # ---- cluster jobs
    def job_command(self, key: Optional[str], rerun: bool, submission: Any) -> list[str]:
        base = [self.python or sys.executable, "-m", "protocols.mixture", self.exp_name, "--out", self.out,
                "--report", self.report, "--stages", *[s.name for s in self.stages]]
        base += [f"--set={a}" for a in self.extra.get("rl", [])] + [f"--sft-set={a}" for a in self.extra.get("sft", [])]
        if key is None:
            return base + ["--seeds", *map(str, self.seeds), "--collect"]
        seed, name = key.split("/", 1)
        return base + ["--seeds", seed[len("seed_"):], "--stage", name, *(["--force", key] if rerun else [])]

    def job_name(self, key: str) -> str:
        return f"mixture:{os.path.basename(self.out)}:{self.exp_name}:{key}"  # as W2S jobs: the out folder first

    def collect_record(self) -> dict:
        return {"command": self.command}


def collected_run(family_dir: str) -> Optional[tuple[str, float]]:
    """(the submitting command, seconds from that submission to now) when this process is the collecting job
    recorded for the family folder (SLURM_JOB_ID), else None: the report that job writes then says what was submitted
    and how long the run took from submission to table, as a local run's report does."""
    job = collecting_job(family_dir)  # the engine's one "am I the collecting job" check
    return None if job is None else (job["command"], time.time() - job["submitted"])


def stage_args(stage: Stage, seed: int, extra: list[str], question_dirs: Optional[dict]) -> list[str]:
    args = ["--config", os.path.join(ROOT, stage.config), f"--seed_everything={seed}", f"--data.seed={seed}",
            *stage.extra, *extra]
    if question_dirs:
        args.append("--data.question_dirs=" + json.dumps(question_dirs))
    return args


def checkpoint_of(stage: Stage, seed_dir: str, config: dict) -> str:
    """Where the stage's ModelCheckpoint writes (from its resolved config), relative paths under the seed dir."""
    for cb in config.get("trainer", {}).get("callbacks") or []:
        if str(cb.get("class_path", "")).endswith("ModelCheckpoint"):
            a = cb.get("init_args", {})
            return os.path.join(seed_dir, a.get("dirpath") or "", (a.get("filename") or "last") + ".ckpt")
    raise ValueError(f"{stage.config}: the protocol needs a ModelCheckpoint callback (it chains stages by checkpoint)")


def identity_of(stage: Stage, args: list[str], upstream: Optional[str], seed_dir: str = ".") -> tuple[dict, dict]:
    """(identity, resolved config) of a stage: every resolved value minus where it writes, the upstream run (its
    init_checkpoint path says nothing about what was trained there) and the contents behind its data options
    (`protocols.engine.data_identity`; relative paths are read from `seed_dir`, the stage's working directory)."""
    from protocols.engine.data_identity import data_identity
    from protocols.engine.stage_identity import resolve_cli_config, without_location

    config = resolve_cli_config(args)
    flat = without_location(config)
    flat.pop(INIT_KEY, None)
    return {"config": flat, "upstream": upstream, "data": data_identity(flat, cwd=seed_dir)}, config


def record_path(out: str, exp: Experiment, seed: int, name: str) -> str:
    """`<out>/<family>/seed_<k>/stages/<stage>.json`: what a stage's run left (status, checkpoint, identity, ...)."""
    return os.path.join(out, exp.family, f"seed_{seed}", "stages", f"{name}.json")


def skipped(stage: Stage) -> dict:
    """The record of a stage whose start stage did not finish."""
    return {"status": "skipped", "error": f"its start stage {stage.start!r} did not finish"}


def finished_record(path: str) -> Optional[dict]:
    """A stage's record when it finished (status done, its checkpoint and table present), else None: a failed or
    half-lost stage is no finished stage and simply runs again."""
    old = _read(path)
    if old is None or old.get("status") != "done" or not os.path.isfile(old.get("checkpoint", "")):
        return None
    return old if _outputs_exist(old) else None


def _run_of(record: dict) -> str:
    """Which run of a stage this is (kept when its identity is renamed for added options)."""
    return record["run"]


def _outputs_exist(record: dict) -> bool:
    return record.get("table") is None or os.path.isfile(record["table"])


def _run(stage: Stage, args: list[str], identity: dict, ckpt: str, seed_dir: str, env: dict, record_file: str,
         seed: int) -> dict:
    from protocols.engine.stage_identity import digest

    key = digest(identity)
    log_name = _log_name(args) or f"mixture/{stage.name}"
    shutil.rmtree(os.path.join(seed_dir, "runs", log_name), ignore_errors=True)  # one version per stage and seed
    if os.path.exists(ckpt):
        os.remove(ckpt)  # a failed run must not leave an older checkpoint looking like its output
    log_path = os.path.join(seed_dir, "stages", f"{stage.name}.log")
    cmd = [sys.executable, os.path.join(ROOT, "cli.py"), "fit", *args]
    start = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + f"\n(in {seed_dir})\n")
        log.flush()
        rc = children.run(cmd, cwd=seed_dir, env=env, stdout=log, stderr=subprocess.STDOUT)  # dies with us
    wall = time.time() - start
    finished = time.time()
    record = {"stage": stage.name, "seed": seed, "identity": identity, "digest": key, "run": f"{key}@{finished}",
              "command": cmd,
              "wall_s": round(wall, 1), "finished": finished,
              "checkpoint": ckpt, "log": log_path, "table": None}
    if rc != 0 or not os.path.isfile(ckpt):
        record.update(status="failed", error=_failure(rc, ckpt, log_path))
    else:
        # the stage's own file: variants of one config (full sequence / persona tokens) write the same ckpt path
        record["checkpoint"] = os.path.join(seed_dir, "checkpoints", f"{stage.name}.ckpt")
        os.makedirs(os.path.dirname(record["checkpoint"]), exist_ok=True)
        os.replace(ckpt, record["checkpoint"])
        record["status"] = "done"
        if stage.sft:
            record["sft"] = _sft_summary(record["checkpoint"])
        else:
            tables = glob.glob(os.path.join(seed_dir, "runs", log_name, "version_*", "*_table.json"))
            record["table"] = max(tables, key=os.path.getmtime) if tables else None
    _write_json(record_file, record)
    return record


def _failure(rc: int, ckpt: str, log_path: str) -> str:
    """Why a stage failed, cause first: its error, or, when the run ended well without writing its checkpoint (e.g.
    `--trainer.max_steps` reached before the checkpoint callback's first save), that missing file."""
    if rc == 0:
        last = _last_error(log_path)
        return (f"the run ended (exit code 0) without writing its checkpoint {ckpt}: its ModelCheckpoint saves after "
                "a validation or an epoch's end, so a run stopped before the first (--trainer.max_steps below "
                "--trainer.val_check_interval, max_time, a signal) leaves none; raise --trainer.max_steps or validate "
                f"sooner. The log ({log_path}) ends with: {last or '(nothing)'}")
    return _last_error(log_path) or f"exit code {rc} (log: {log_path})"


def _log_name(args: list[str]) -> Optional[str]:
    names = [a.split("=", 1)[1] for a in args if a.startswith("--trainer.logger.init_args.name=")]
    return names[-1] if names else _config_log_name(args)


def _config_log_name(args: list[str]) -> Optional[str]:
    import yaml

    cfg = yaml.safe_load(open(args[args.index("--config") + 1]))
    return ((cfg.get("trainer") or {}).get("logger") or {}).get("init_args", {}).get("name")


def _sft_summary(ckpt: str) -> dict:
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    fid = state.get("persona_fidelity") or {}
    return {"steps": int(state.get("global_step", 0)), "fidelity_mean": fid.get("mean"),
            "fidelity_min": fid.get("min"), "capability": fid.get("capability")}


def _last_error(log_path: str) -> str:
    lines = [l.strip() for l in open(log_path, errors="replace") if l.strip()]
    errors = [l for l in lines if "Error" in l.split(":")[0] or l.startswith("ValueError")]
    return (errors[-1] if errors else (lines[-1] if lines else ""))[:400]


def _read(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def _write_json(path: str, obj) -> None:
    from datamodules.atomic_files import atomic_write

    atomic_write(path, json.dumps(obj, indent=1, default=str))
