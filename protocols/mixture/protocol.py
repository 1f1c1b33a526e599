"""One command per Part B experiment, over seeds: SFT, then the RL stages, then a table of mean ± std and per-seed values.

    python -m protocols.mixture two_policies                      # seeds 0 1 2, two processes at a time
    python -m protocols.mixture 6c3 --seeds 0 1 2 3 4 --jobs 2
    python -m protocols.mixture --list                            # the experiments and their stages
    python -m protocols.mixture my_experiment.yaml --seeds 0      # an experiment file of your own (own family too)

The shipped experiments are configs/mixture/experiments/<name>.yaml (`protocols.mixture.experiments` reads them and
a user's file alike); a family of one's own is a family file (datamodules/triggers/family_files.py), named by the
experiment's `family_file` (docs/policy_mixtures.md#your-own-family).

Each seed runs in its own directory, `<out>/<family>/seed_<k>/`, as the working directory of every stage, so the
configs' relative `runs/...` paths (logs, checkpoints, the RL stages' `init_checkpoint`) stay apart per seed. A seed
varies the SFT *and* the RL stages: `--seed_everything=k --data.seed=k` (weights, sampled rollouts, training and
held-out questions). Stages are `python cli.py fit --config configs/mixture/<config>.yaml ...` subprocesses; seeds
run in parallel (`--jobs`; `OMP_NUM_THREADS` = cores / jobs unless set), the stages of one seed in order.

A finished stage is reused only when its identity is unchanged: the fully resolved `cli.py` configuration (every value
after parsing the config files and overrides, minus where it writes), the run of the stage it starts from, and the
contents behind its data options (`protocols.engine.data_identity`). An experiment that shares a family's SFT (e.g.
`two_policies_algorithms`) therefore trains it once. A finished stage of another identity is refused, naming the
differences, unless `--force` (every stage) or `--force <stage> ...` names it: the same rules and code as the W2S
protocol (`protocols.engine.stage_identity`, docs/reruns.md). One run per family folder at a time (`<out>/<family>/.lock`).
A stage that fails (e.g. RL refused by the fidelity gate) is reported with its error; the stages that start from it
are skipped.

Outputs: `<out>/<family>/<experiment>_seeds_<seeds>_results.md|json` (per stage: before/after table over seeds, history
of means, per-seed values and wall times; one set, swapped in at once), TensorBoard logs under each seed directory.

This file declares the protocol's options (`COMMAND`: the engine's command line, `protocols.engine.command`, parses
them with the shared flags); the stages and their side of the stage engine are `protocols.mixture.stages`; the engine
(`protocols.engine`) plans, reuses, runs (up to `--jobs` stages at once here, each a subprocess; SLURM jobs with
`--launcher slurm`) and prints one progress line per stage.
"""
from __future__ import annotations

import os
from typing import Optional

from protocols.engine import command
from protocols.engine.spec import StageSpec
from protocols.mixture.stages import (  # noqa: F401 -- the protocol's public names
    ROOT, Experiment, MixtureHooks, Stage, _failure, identity_of, stage_args,
)
from protocols.mixture.experiments import find_experiment, shipped_experiments
from protocols.engine.stage_identity import ForceSpec, check_seeds

EXPERIMENTS: dict[str, Experiment] = shipped_experiments()  # configs/mixture/experiments/<name>.yaml


OPTIONS = (
    (("experiment",), dict(nargs="?", help="a shipped experiment (--list) or an experiment file of your own (.yaml; "
                                           "docs/policy_mixtures.md#your-own-family)")),
    (("--seeds",), dict(type=int, nargs="+", default=[0, 1, 2])),
    (("--jobs",), dict(type=int, default=min(2, os.cpu_count() or 1), help="stages run at once (each a process)")),
    (("--out",), dict(default=os.path.join("runs", "mixture"), help="root of the per-seed directories")),
    (("--stages",), dict(nargs="+", help="run only these stages (and what they start from)")),
    (("--set",), dict(action="append", default=[], help="extra cli.py argument for every RL stage")),
    (("--sft-set",), dict(action="append", default=[], help="extra cli.py argument for the SFT stage")),
    (("--report",), dict(help="report name (default: <experiment>_seeds_<seeds>); use one per --set variant")),
    (("--list",), dict(action="store_true", help="list the experiments and their stages")),
)


class MixtureRun(MixtureHooks):
    """One experiment over seeds: up to `workers` (`--jobs`) stages at once; the command prints the report and exits
    1 when a stage failed."""

    def specs(self, force=None, only=None, planned=False) -> list[StageSpec]:
        return super().specs()  # a stage is validated as it runs (`cli.py`'s own parser, in its process)

    def outcome(self, mode: str, value, results: Optional[dict] = None) -> int:
        if mode == "stage":  # a job: its stage ran, whatever its outcome (a failure is a record, as in a local run)
            return 0 if value["status"] in ("done", "failed", "skipped") else 1
        if mode != "published":
            return 0
        print(f"{open(value).read()}\nwritten: {value}")
        return 1 if any(r["status"] != "done" for r in results.values()) else 0


def _build(options: dict, modes: command.Modes, error) -> MixtureRun | int:
    if options["list"] or options["experiment"] is None:
        for name, exp in EXPERIMENTS.items():
            print(f"{name} ({exp.family}): " + ", ".join(s.name for s in exp.stages) + f"\n    {exp.summary}")
        return 0
    try:
        exp_name, exp = find_experiment(options["experiment"], EXPERIMENTS)
    except ValueError as err:  # an unknown name, a bad experiment or family file: one line naming the file and field
        error(str(err))
    stages, seeds, jobs = _selected(exp, options["stages"]), options["seeds"], options["jobs"]
    if len(set(seeds)) != len(seeds):
        error(f"--seeds repeats a seed: {seeds}")
    if jobs < 1:
        error("--jobs must be >= 1")
    names = [s.name for s in stages]
    if modes.stage and (len(seeds) != 1 or modes.stage not in names):
        error(f"--stage {modes.stage!r} runs one stage of one seed: give --seeds k and a stage of {names}")
    try:
        check_seeds(seeds)  # `--seeds -3` made a `seed_-3/` folder and published a report
        modes.force.check(set(names), seeds=seeds)
    except ValueError as err:
        error(str(err))
    if modes.slurm.world_size > 1:  # the stages' records are written by one process; DDP inside a stage: W2S only
        error("--slurm.nodes / --slurm.ntasks_per_node > 1: a mixture stage runs as one process (its policy modules "
              "are DDP-exact, but the protocol's stage runner is not rank-aware yet); use 1")
    if modes.stage:
        modes.stage = f"seed_{seeds[0]}/{modes.stage}"  # the stage's key
    out = os.path.abspath(options["out"])
    short = os.path.splitext(os.path.basename(exp_name))[0]  # a file's report is named by its file
    report = options["report"] or f"{short}_seeds_{'-'.join(map(str, seeds))}"
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // min(jobs, len(seeds))))
    hooks = MixtureRun(exp_name, exp, stages, seeds, out, {"sft": options["sft_set"], "rl": options["set"]},
                       threads, None, report, " ".join(["python -m protocols.mixture", *modes.argv]))
    hooks.workers = jobs
    if exp.question_fixtures:  # rewritten only when their content differs: a job's call leaves them as they are
        from datamodules.triggers.question_fixtures import write_question_fixtures

        hooks.question_dirs = write_question_fixtures(os.path.join(out, exp.family, "questions"))
    return hooks


COMMAND = command.Command(__doc__, _build, options=OPTIONS)


def main(argv=None) -> int:
    """Runs the experiment as the flags say (`protocols.engine.command`); 0, or 1 when a stage failed."""
    return command.main(COMMAND, argv)


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

