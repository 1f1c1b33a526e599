"""One command per Part B experiment, over seeds: SFT, then the RL stages, then a table of mean ± std and per-seed values.

    python -m protocols.mixture two_policies                      # seeds 0 1 2, two processes at a time
    python -m protocols.mixture 6c3 --seeds 0 1 2 3 4 --jobs 2
    python -m protocols.mixture --list                            # the experiments and their stages
    python -m protocols.mixture my_experiment.yaml --seeds 0      # an experiment file of your own (own family too)

The shipped experiments are configs/mixture/experiments/<name>.yaml (`protocols.mixture_experiments` reads them and
a user's file alike); a family of one's own is a family file (datamodules/triggers/family_files.py), named by the
experiment's `family_file` (docs/policy_mixtures.md#your-own-family).

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

This file holds the command line; the stages and their side of the stage engine are
`protocols.mixture_stages`; the engine (`protocols.engine`) plans, reuses, runs (up to `--jobs` stages at once here,
each a subprocess; SLURM jobs with `--launcher slurm`) and prints one progress line per stage.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from protocols.engine import cluster, local, status as engine_status
from protocols.engine.progress import Progress
from protocols.engine.slurm_options import add_slurm_arguments, options_from_args
from protocols.engine.status import print_status
from protocols.mixture_stages import (  # noqa: F401 -- the protocol's public names
    ROOT, Experiment, MixtureHooks, Stage, _failure, identity_of, stage_args,
)
from protocols.mixture_experiments import find_experiment, shipped_experiments
from protocols.run_files import OutDirLock
from protocols.stage_identity import ForceSpec, check_seeds


EXPERIMENTS: dict[str, Experiment] = shipped_experiments()  # configs/mixture/experiments/<name>.yaml


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", nargs="?", help="a shipped experiment (--list) or an experiment file of your own "
                                                 "(.yaml; docs/policy_mixtures.md#your-own-family)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="stages run at once (each a process)")
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
    p = _parser()
    args = p.parse_args(argv)
    if args.list or args.experiment is None:
        for name, exp in EXPERIMENTS.items():
            print(f"{name} ({exp.family}): " + ", ".join(s.name for s in exp.stages) + f"\n    {exp.summary}")
        return 0
    try:
        exp_name, exp = find_experiment(args.experiment, EXPERIMENTS)
    except ValueError as err:  # an unknown name, a bad experiment or family file: one line naming the file and field
        p.error(str(err))
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
        check_seeds(args.seeds)  # `--seeds -3` made a `seed_-3/` folder and published a report
        force.check({s.name for s in stages}, seeds=args.seeds)
        opts = options_from_args(args)
    except ValueError as err:
        p.error(str(err))
    if opts.world_size > 1:  # the stages' records are written by one process; DDP inside a stage: W2S only
        p.error("--slurm.nodes / --slurm.ntasks_per_node > 1: a mixture stage runs as one process (its policy "
                "modules are DDP-exact, but the protocol's stage runner is not rank-aware yet); use 1")
    out = os.path.abspath(args.out)
    short = os.path.splitext(os.path.basename(exp_name))[0]  # a file's report is named by its file
    name = args.report or f"{short}_seeds_{'-'.join(map(str, args.seeds))}"
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // min(args.jobs, len(args.seeds))))
    command = " ".join(["python -m protocols.mixture", *(argv if argv is not None else sys.argv[1:])])
    hooks = MixtureHooks(exp_name, exp, stages, args.seeds, out, {"sft": args.sft_set, "rl": args.set},
                         threads, None, name, command)
    hooks.python = opts.python
    specs = hooks.specs()
    if exp.question_fixtures:  # rewritten only when their content differs: a job's call leaves them as they are
        from datamodules.triggers.question_fixtures import write_question_fixtures

        hooks.question_dirs = write_question_fixtures(os.path.join(out, exp.family, "questions"))
    if args.status:
        print_status(engine_status.stage_rows(specs, hooks, changed=_changed_check(hooks)))
        return 0
    if force:  # a forced run trusts no cached file hash (a rewrite may have kept size and mtime: docs/reruns.md)
        from protocols.data_identity import rehash_files

        rehash_files()
    if args.stage:  # a job: this stage only, under its own lock (the family lock is the submitter's)
        record = local.run_one(specs, hooks, f"seed_{args.seeds[0]}/{args.stage}", force)
        return 0 if record["status"] in ("done", "failed", "skipped") else 1
    jobs: dict[str, str] = {}
    if args.launcher == "slurm" and not args.collect:
        cluster.preflight(specs, hooks, force, opts)
    with OutDirLock(hooks.root):  # one run per family folder: its stages and checkpoints
        if args.collect:
            results = local.results_on_disk(specs, hooks)
        else:
            local.refuse_changed(specs, hooks, force)
            if args.launcher == "slurm":
                jobs = cluster.submit(specs, hooks, force, opts)
                results = {} if jobs else local.results_on_disk(specs, hooks)  # all finished: the report now
            else:
                results = local.run_local(specs, hooks, force, workers=args.jobs, progress=Progress(specs, hooks))
        md = None if jobs else hooks.publish(specs, results)
    if jobs:
        if args.wait:
            cluster.wait(jobs, hooks)
        print_status(engine_status.stage_rows(specs, hooks))
        return 0
    print(open(md).read())
    print(f"written: {md}")
    failed = [k for k, r in results.items() if r["status"] != "done"]
    return 1 if failed else 0



def _changed_check(hooks: MixtureHooks):
    """For `--status`: what a rerun would refuse of a finished stage (its configuration or data changed)."""
    return lambda spec, result: local.changes_before_work(spec, hooks, result)


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
