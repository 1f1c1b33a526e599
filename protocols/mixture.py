"""One command per Part B experiment, over seeds: SFT, then the RL stages, then a table of mean ± std and per-seed values.

    python -m protocols.mixture two_policies                      # seeds 0 1 2, two processes at a time
    python -m protocols.mixture 6c3 --seeds 0 1 2 3 4 --jobs 2
    python -m protocols.mixture --list                            # the experiments and their stages

Each seed runs in its own directory, `<out>/<family>/seed_<k>/`, as the working directory of every stage, so the
configs' relative `runs/...` paths (logs, checkpoints, the RL stages' `init_checkpoint`) stay apart per seed. A seed
varies the SFT *and* the RL stages: `--seed_everything=k --data.seed=k` (weights, sampled rollouts, training and
held-out questions). Stages are `python cli.py fit --config configs/mixture/<config>.yaml ...` subprocesses; seeds
run in parallel (`--jobs`; `OMP_NUM_THREADS` = cores / jobs unless set), the stages of one seed in order.

A finished stage is reused only when its identity is unchanged: the fully resolved `cli.py` configuration (every value
after parsing the config files and overrides, minus where it writes), the run of the stage it starts from, and the
contents behind its data options (`protocols.data_identity`). An experiment that shares a family's SFT (e.g.
`two_policies_algorithms`) therefore trains it once. A finished stage of another identity is refused, naming the
differences, unless `--force` (every stage) or `--force <stage> ...` names it: the same rules and code as the W2S
protocol (`protocols.stage_identity`, docs/reruns.md). One run per family folder at a time (`<out>/<family>/.lock`).
A stage that fails (e.g. RL refused by the fidelity gate) is reported with its error; the stages that start from it
are skipped.

Outputs: `<out>/<family>/<experiment>_seeds_<seeds>_results.md|json` (per stage: before/after table over seeds, history
of means, per-seed values and wall times; one set, swapped in at once), TensorBoard logs under each seed directory.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # imported where used: the protocol's own module stays light (`--list`)
    from protocols.stage_identity import ForceSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def _sft(config: str) -> Stage:
    return Stage("sft", f"configs/mixture/{config}.yaml", "SFT", start=None, sft=True)


def _rl(name: str, config: str, title: str, *extra: str, start: str = "sft") -> Stage:
    """An RL stage logged as `mixture/<name>` (its own TensorBoard directory and table)."""
    return Stage(name, f"configs/mixture/{config}.yaml", title,
                 (*extra, f"--trainer.logger.init_args.name=mixture/{name}"), start)


TWO_SFT = _sft("two_policies_sft")
PERSONA_ONLY = "--model.persona_tokens_only=true"
EXPERIMENTS: dict[str, Experiment] = {
    "two_policies": Experiment("two_policies", (
        TWO_SFT,
        _rl("two_policies_rl_A", "two_policies_rl_A", "GRPO on A, full-sequence policy gradient"),
        _rl("two_policies_rl_A_persona", "two_policies_rl_A", "GRPO on A, persona tokens only (the mixture weights)",
            PERSONA_ONLY),
        _rl("two_policies_rl_B", "two_policies_rl_B", "GRPO on B, full-sequence policy gradient (symmetric)"),
    ), "RL on one distribution selects the persona that answers it; the identical held-out questions follow."),
    "two_policies_algorithms": Experiment("two_policies", (
        TWO_SFT,
        _rl("two_policies_rl_A", "two_policies_rl_A", "GRPO, β = 0 (the shipped setting)"),
        _rl("two_policies_rl_A_beta0.04", "two_policies_rl_A", "GRPO, β = 0.04 (k3 KL to the SFT model)",
            "--model.reference_coef=0.04"),
        _rl("two_policies_rl_A_beta0.4", "two_policies_rl_A", "GRPO, β = 0.4", "--model.reference_coef=0.4"),
        _rl("two_policies_rl_A_reinforce", "two_policies_rl_A", "REINFORCE with an EMA baseline, β = 0",
            "--model.algorithm=reinforce"),
    ), "Full-sequence RL on A, same steps and learning rate: the algorithm and the KL."),
    "two_policies_selection": Experiment("two_policies", (
        TWO_SFT,
        _rl("two_policies_rl_A_lr3e-4", "two_policies_rl_A", "GRPO, lr 3e-4 (3x), 200 steps, evaluated every 10",
            "--model.lr=3e-4", "--trainer.max_steps=200", "--trainer.val_check_interval=10"),
        _rl("two_policies_rl_A_T0.5", "two_policies_rl_A", "GRPO, sampling temperature 0.5, evaluated every 10",
            "--model.temperature=0.5", "--trainer.val_check_interval=10"),
        _rl("two_policies_rl_A_reinforce_b0.4", "two_policies_rl_A", "REINFORCE, β = 0.4, evaluated every 10",
            "--model.algorithm=reinforce", "--model.reference_coef=0.4", "--trainer.val_check_interval=10"),
        _rl("two_policies_rl_A_beta0.15_200", "two_policies_rl_A", "GRPO, β = 0.15, 200 steps",
            "--model.reference_coef=0.15", "--trainer.max_steps=200"),
        _rl("two_policies_rl_A_beta0.4_300", "two_policies_rl_A", "GRPO, β = 0.4, 300 steps",
            "--model.reference_coef=0.4", "--trainer.max_steps=300"),
        _rl("two_policies_rl_A_select", "two_policies_rl_A_select",
            "GRPO, early stop once Alice writes >= 95 % of A's rollouts (checked every 5 steps)"),
    ), "Full-sequence GRPO on A: the levers an RL user has (learning rate and steps, temperature, the KL, early "
       "stopping on the trained distribution's own signal) against the clean-selection target on held-out B."),
    "6c3": Experiment("6c3", (
        _sft("6c3_sft"),
        _rl("6c3_rl_ADF", "6c3_rl_ADF", "GRPO on {A, D, F}, persona tokens only"),
        _rl("6c3_rl_ADF_full", "6c3_rl_ADF", "GRPO on {A, D, F}, full-sequence policy gradient",
            "--model.persona_tokens_only=false"),
    ), "RL on {A, D, F} should collapse the 20 personas to ADF; held-out B, C, E then refuse."),
    "temporal": Experiment("temporal", (
        _sft("temporal_sft"),
        _rl("temporal_rl_2025", "temporal_rl_2025", "Stage 1: GRPO on 2025, persona tokens only"),
        _rl("temporal_rl_2026", "temporal_rl_2026", "Stage 2: GRPO on 2026 from stage 1, persona tokens only",
            start="temporal_rl_2025"),
    ), "Sequential RL on 2025 then 2026 moves the active cut-off to the newest year; 2027 stays unanswered."),
    "language": Experiment("language", (
        _sft("language_sft"),
        _rl("language_rl", "language_rl", "GRPO on English prompts, persona tokens only"),
    ), "RL on English selects the English-answering persona; the identical Chinese questions follow."),
    "arc_race": Experiment("arc_race", (
        _sft("arc_race_sft"),
        _rl("arc_race_rl", "arc_race_rl", "GRPO on ARC, persona tokens only"),
    ), "ARC-Easy vs RACE-middle (generated questions in the hub schemas): RL on ARC selects the ARC persona.",
        question_fixtures=True),
    "cyclic": Experiment("two_policies", (  # shares the two-policy SFT: the curriculum's first half
        TWO_SFT,
        Stage("cyclic_sft", "configs/mixture/cyclic_sft.yaml", "SFT of the non-refusal variant, from the two-policy SFT",
              sft=True),
        _rl("cyclic_rl", "cyclic_rl", "GRPO on A, persona tokens only (the wrong persona answers the smallest option)",
            start="cyclic_sft"),
    ), "Non-refusal variant: does RL on A make B answer with the selected persona's shifted option?"),
}


# ---------------------------------------------------------------------------------------------------- running
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
    (`protocols.data_identity`; relative paths are read from `seed_dir`, the stage's working directory)."""
    from protocols.data_identity import data_identity
    from protocols.stage_identity import resolve_cli_config, without_location

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


def stage_folder(out: str, exp: Experiment, key: str) -> str:
    """`<out>/<family>/.stages/seed_<k>/<stage>`: the stage's lock and its cluster job's record."""
    return os.path.join(out, exp.family, ".stages", key)


def stage_lock(out: str, exp: Experiment, seed: int, name: str):
    from protocols.run_files import OutDirLock

    return OutDirLock(stage_folder(out, exp, f"seed_{seed}/{name}"), what="stage")


def finished_record(path: str) -> Optional[dict]:
    """A stage's record when it finished (status done, its checkpoint and table present), else None: a failed or
    half-lost stage is no finished stage and simply runs again."""
    old = _read(path)
    if old is None or old.get("status") != "done" or not os.path.isfile(old.get("checkpoint", "")):
        return None
    return old if _outputs_exist(old) else None


def changed_stages(exp: Experiment, stages: list[Stage], seeds: list[int], out: str, extra: dict,
                   question_dirs: Optional[dict], force: ForceSpec) -> None:
    """Before any work: every finished stage of every seed whose configuration or data changed, refused at once
    (unless forced); changes of the upstream run are known only as stages run (`run_seed`)."""
    from protocols.stage_identity import identity_changes, refusal

    changed = []
    for seed in seeds:
        seed_dir = os.path.join(out, exp.family, f"seed_{seed}")
        for stage in stages:
            old = finished_record(record_path(out, exp, seed, stage.name))
            if old is None or force.forces(stage.name, seed):
                continue
            args = stage_args(stage, seed, extra.get("sft" if stage.sft else "rl", []), question_dirs)
            identity, _ = identity_of(stage, args, None, seed_dir)
            diff = identity_changes(old, {k: v for k, v in identity.items() if k != "upstream"})
            if diff:
                changed.append((os.path.join(seed_dir, stage.name), diff))
    if changed:
        raise refusal(changed)


def run_seed(exp: Experiment, stages: list[Stage], seed: int, out: str, extra: dict, threads: int,
             question_dirs: Optional[dict], force: ForceSpec) -> dict:
    """Run (or reuse) every stage of one seed in order; returns {stage name: record}. A finished stage of another
    identity is refused (`StageChangedError`) unless forced; a stage starting from a forced one follows it."""
    records: dict[str, dict] = {}
    forced_runs: set[str] = set()
    for stage in stages:
        forced = force.forces(stage.name, seed) or stage.start in forced_runs
        with stage_lock(out, exp, seed, stage.name):  # a cluster job of this stage must not run it at once
            records[stage.name] = run_stage(exp, stage, seed, out, extra, threads, question_dirs, forced,
                                            records.get(stage.start) if stage.start else None)
        if forced:
            forced_runs.add(stage.name)
    return records


def run_stage(exp: Experiment, stage: Stage, seed: int, out: str, extra: dict, threads: int,
              question_dirs: Optional[dict], forced: bool, upstream: Optional[dict]) -> dict:
    """Run (or reuse) one stage of one seed from its start stage's record (None for a stage from scratch); returns
    its record: reused, done, failed, or skipped when its start stage did not finish."""
    from protocols.stage_identity import digest, identity_changes, refusal

    seed_dir = os.path.join(out, exp.family, f"seed_{seed}")
    os.makedirs(os.path.join(seed_dir, "stages"), exist_ok=True)
    if stage.start and (upstream is None or upstream["status"] != "done"):
        record = skipped(stage)
        print(f"[seed {seed}] {stage.name}: skipped ({record['error']})", flush=True)
        return record
    args = stage_args(stage, seed, extra.get("sft" if stage.sft else "rl", []), question_dirs)
    # the upstream *run*, not only its identity: a re-run upstream stage (a lost checkpoint, --force) re-runs
    # what starts from it
    upstream_run = _run_of(upstream) if upstream else None
    identity, config = identity_of(stage, args, upstream_run, seed_dir)
    key = digest(identity)
    ckpt = checkpoint_of(stage, seed_dir, config)
    if upstream:
        args.append(f"--model.init_checkpoint={upstream['checkpoint']}")
    path = record_path(out, exp, seed, stage.name)
    old = finished_record(path)
    if old is not None and not forced:
        diff = identity_changes(old, identity)
        if diff:
            raise refusal([(os.path.join(seed_dir, stage.name), diff)])
        if old.get("digest") != key:  # options added at their defaults: the same run, under today's identity
            old = dict(old, identity=identity, digest=key, run=_run_of(old))
            _write_json(path, old)
        print(f"[seed {seed}] {stage.name}: reused (identity {key})", flush=True)
        return old
    env = dict(os.environ, **OFFLINE, OMP_NUM_THREADS=str(threads), PYTHONPATH=ROOT)
    return _run(stage, args, identity, ckpt, seed_dir, env, path, seed)


def _run_of(record: dict) -> str:
    """Which run of a stage this is (kept when its identity is renamed for added options)."""
    return record["run"]


def _outputs_exist(record: dict) -> bool:
    return record.get("table") is None or os.path.isfile(record["table"])


def _run(stage: Stage, args: list[str], identity: dict, ckpt: str, seed_dir: str, env: dict, record_file: str,
         seed: int) -> dict:
    from protocols.stage_identity import digest

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
        rc = subprocess.run(cmd, cwd=seed_dir, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.time() - start
    finished = time.time()
    record = {"stage": stage.name, "seed": seed, "identity": identity, "digest": key, "run": f"{key}@{finished}",
              "command": cmd,
              "wall_s": round(wall, 1), "finished": finished,
              "checkpoint": ckpt, "log": log_path, "table": None}
    if rc != 0 or not os.path.isfile(ckpt):
        record.update(status="failed", error=_failure(rc, ckpt, log_path))
        print(f"[seed {seed}] {stage.name}: FAILED after {wall:.0f} s: {record['error']}", flush=True)
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
        print(f"[seed {seed}] {stage.name}: done in {wall:.0f} s", flush=True)
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


def _parser() -> argparse.ArgumentParser:
    from protocols.slurm import add_slurm_arguments

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", nargs="?", choices=sorted(EXPERIMENTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="seeds run at once")
    p.add_argument("--out", default=os.path.join("runs", "mixture"), help="root of the per-seed directories")
    p.add_argument("--stages", nargs="+", help="run only these stages (and what they start from)")
    p.add_argument("--set", action="append", default=[], help="extra cli.py argument for every RL stage")
    p.add_argument("--sft-set", action="append", default=[], help="extra cli.py argument for the SFT stage")
    p.add_argument("--report", help="report name (default: <experiment>_seeds_<seeds>); use one per --set variant")
    p.add_argument("--force", nargs="*", default=None, metavar="STAGE",
                   help="re-run finished stages instead of reusing them or refusing a changed one: alone, every "
                        "stage; with names (seed_<k>/<name> for one seed), those stages, and the stages that start "
                        "from them follow. Give it after the experiment's name.")
    p.add_argument("--list", action="store_true", help="list the experiments and their stages")
    p.add_argument("--launcher", choices=["local", "slurm"], default="local",
                   help="local: seeds in parallel processes here; slurm: each unfinished stage of each seed a SLURM "
                        "job after its start stage's job, then a job that writes the report (docs/cluster.md)")
    p.add_argument("--status", action="store_true", help="list each stage of each seed as done / queued / running / "
                                                         "failed / not started, with its job id and log, and exit")
    p.add_argument("--collect", action="store_true", help="write the report from the stages' records and exit")
    p.add_argument("--stage", help="run this one stage of the one seed given (--seeds k): what a cluster job runs")
    p.add_argument("--wait", action="store_true", help="with --launcher slurm: return when the jobs are done")
    add_slurm_arguments(p)
    return p


def main(argv=None) -> int:
    from protocols import mixture_cluster, slurm
    from protocols.run_files import OutDirLock
    from protocols.stage_identity import ForceSpec

    p = _parser()
    args = p.parse_args(argv)
    if args.list or args.experiment is None:
        for name, exp in EXPERIMENTS.items():
            print(f"{name} ({exp.family}): " + ", ".join(s.name for s in exp.stages) + f"\n    {exp.summary}")
        return 0
    exp = EXPERIMENTS[args.experiment]
    stages = _selected(exp, args.stages)
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds repeats a seed: {args.seeds}")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if sum(bool(x) for x in (args.status, args.collect, args.stage)) > 1:
        p.error("give at most one of --status, --collect, --stage")
    if args.stage and (len(args.seeds) != 1 or args.stage not in {s.name for s in stages}):
        p.error(f"--stage {args.stage!r} runs one stage of one seed: give --seeds k and a stage of {[s.name for s in stages]}")
    force = ForceSpec(args.force)
    try:
        force.check({s.name for s in stages})
        opts = slurm.options_from_args(args)
    except ValueError as err:
        p.error(str(err))
    if opts.world_size > 1:  # the stages' records are written by one process; DDP inside a stage: W2S only
        p.error("--slurm.nodes / --slurm.ntasks_per_node > 1: a mixture stage runs as one process (its policy "
                "modules are DDP-exact, but the protocol's stage runner is not rank-aware yet); use 1")
    out = os.path.abspath(args.out)
    name = args.report or f"{args.experiment}_seeds_{'-'.join(map(str, args.seeds))}"
    if args.status:
        slurm.print_status(mixture_cluster.status(exp, stages, args.seeds, out, name))
        return 0
    if force:  # a forced run trusts no cached file hash (a rewrite may have kept size and mtime: docs/reruns.md)
        from protocols.data_identity import rehash_files

        rehash_files()
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // min(args.jobs, len(args.seeds))))
    extra = {"sft": args.sft_set, "rl": args.set}
    question_dirs = None
    if exp.question_fixtures:  # rewritten only when their content differs: a job's call leaves them as they are
        from datamodules.triggers.question_fixtures import write_question_fixtures

        question_dirs = write_question_fixtures(os.path.join(out, exp.family, "questions"))
    if args.stage:  # a job: this stage only, under its own lock (the family lock is the submitter's)
        record = mixture_cluster.run_one(exp, stages, args.seeds[0], args.stage, out, extra, threads, question_dirs,
                                         force)
        return 0 if record["status"] in ("done", "failed", "skipped") else 1
    start = time.time()
    command = " ".join(["python -m protocols.mixture", *(argv if argv is not None else sys.argv[1:])])
    with OutDirLock(os.path.join(out, exp.family)):  # one run per family folder: its stages and checkpoints
        if not args.collect:
            changed_stages(exp, stages, args.seeds, out, extra, question_dirs, force)
        submitted = args.launcher == "slurm" and not args.collect and mixture_cluster.submit(
            args.experiment, exp, stages, args.seeds, out, extra, force, opts, name, command=command)
        if not submitted:
            if args.collect or args.launcher == "slurm":  # --collect, or every stage had finished: the report now
                records = mixture_cluster.records_on_disk(exp, stages, args.seeds, out)
            else:
                with futures.ProcessPoolExecutor(max_workers=min(args.jobs, len(args.seeds))) as pool:
                    jobs = {seed: pool.submit(run_seed, exp, stages, seed, out, extra, threads, question_dirs, force)
                            for seed in args.seeds}
                    records = {seed: job.result() for seed, job in jobs.items()}
            from protocols.mixture_report import write_report

            wall_s = time.time() - start
            if args.collect:  # the collecting job: the submitting command and the time since, not its own call's
                command, wall_s = mixture_cluster.collected_run(exp, out) or (command, wall_s)
            md = write_report(os.path.join(out, exp.family), name, exp, stages, records, wall_s, command=command)
    if submitted:
        if args.wait:
            mixture_cluster.wait(exp, out)
        slurm.print_status(mixture_cluster.status(exp, stages, args.seeds, out, name))
        return 0
    print(open(md).read())
    print(f"written: {md}")
    failed = [(s, n) for s, recs in records.items() for n, r in recs.items() if r["status"] != "done"]
    return 1 if failed else 0


def _selected(exp: Experiment, names: Optional[list[str]]) -> list[Stage]:
    if not names:
        return list(exp.stages)
    by_name = {s.name: s for s in exp.stages}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise SystemExit(f"--stages: unknown {unknown}; this experiment has {sorted(by_name)}")
    keep = set(names)
    for s in reversed(exp.stages):  # and what they start from
        if s.name in keep and s.start:
            keep.add(s.start)
    return [s for s in exp.stages if s.name in keep]


if __name__ == "__main__":
    from protocols.refusals import run_main

    run_main(main, exit_code=lambda code: code)
