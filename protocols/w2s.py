"""The weak-to-strong protocol in one command (SPEC A.2):

    teacher (gold, teacher half) -> soft labels on the student half -> ceiling (gold, student half)
    -> every student method -> ID/OOD tests -> results.json / results.csv / results.md + TensorBoard figures

    python -m protocols.w2s --config configs/experiment/w2s_synthetic.yaml

Every stage is an ordinary `cli.py fit` + `cli.py test` (its command lines are written to the stage folder, so any
stage can be re-run by hand) and writes `result.json` atomically when it is complete: re-running skips finished
stages (and refuses one whose recorded arguments differ from the current ones), and a crash loses nothing already
finished. Several seeds per method are reported as mean ± std.
"""
from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from jsonargparse import ArgumentParser, ActionConfigFile

from datamodules.preference.weak_labels import atomic_write_json


@dataclass
class Method:
    """One student method: a preference objective, optionally anchored.

    Args:
        name: row name in the results (e.g. "naive", "anchor_lam100").
        objective: objective class in `lightning_modules.reward.objectives` ("SoftBradleyTerry", "ConfidenceW2S", ...).
        objective_args: its init arguments (e.g. {"aux_coef": 0.5}).
        anchor_coef: ANCHOR's λ (0 = no anchor).
        anchor_layers: anchored depth fractions (1.0 = last layer).
        args: extra `cli.py` arguments for this method's stages.
    """

    name: str
    objective: str = "SoftBradleyTerry"
    objective_args: dict = field(default_factory=dict)
    anchor_coef: float = 0.0
    anchor_layers: list[float] = field(default_factory=lambda: [1.0])
    args: list[str] = field(default_factory=list)

    def cli_args(self) -> list[str]:
        objective = {"class_path": f"lightning_modules.reward.objectives.{self.objective}", "init_args": self.objective_args}
        return [f"--model.objective={json.dumps(objective)}", f"--model.anchor_coef={self.anchor_coef}",
                f"--model.anchor_layers={json.dumps(self.anchor_layers)}", *self.args]


@dataclass
class W2SProtocol:
    """Protocol configuration.

    Args:
        out_dir: where stages, results and figures go.
        trainer_configs: `cli.py` config files with the trainer settings (shared by all stages).
        data_configs: config files of the PreferenceDataModule (source, OOD targets, ...).
        teacher_configs: config files of the weak teacher model.
        student_configs: config files of the strong student model (shared by the ceiling and every method).
        methods: the student methods.
        seeds: one teacher, one label set, one ceiling and one student per method, per seed.
        ceiling: train the ceiling (student on gold labels of the student half) and report PGR.
        teacher_args: extra `cli.py` arguments of the teacher stages.
        student_args: extra `cli.py` arguments of the ceiling and student stages.
        teacher_checkpoint: "best" (by gold validation accuracy; the teacher is trained on gold labels) or "last".
        student_checkpoint: "last" (default: selecting students on gold validation labels would leak gold
            supervision into W2S) or "best".
        drift: add the drift-diagnostics callback to student stages and report its final values.
    """

    out_dir: str
    trainer_configs: list[str]
    data_configs: list[str]
    teacher_configs: list[str]
    student_configs: list[str]
    methods: list[Method]
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    ceiling: bool = True
    teacher_args: list[str] = field(default_factory=list)
    student_args: list[str] = field(default_factory=list)
    teacher_checkpoint: str = "best"
    student_checkpoint: str = "last"
    drift: bool = True

    def __post_init__(self) -> None:
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names):
            raise ValueError(f"--methods has duplicate names: {names}")
        reserved = {"teacher", "ceiling"} & set(names)
        if reserved:
            raise ValueError(f"--methods may not be named {sorted(reserved)} (reserved rows)")
        for flag in ("teacher_checkpoint", "student_checkpoint"):
            if getattr(self, flag) not in ("best", "last"):
                raise ValueError(f"--{flag} must be 'best' or 'last', got {getattr(self, flag)!r}")
        if not self.seeds:
            raise ValueError("--seeds must list at least one seed")
        for path in [*self.trainer_configs, *self.data_configs, *self.teacher_configs, *self.student_configs]:
            if not os.path.isfile(path):
                raise ValueError(f"config file {path!r} does not exist")


# ---- running stages -------------------------------------------------------------------------------------------
def run_stage(stage_dir: str, base_args: list[str], checkpoint: str) -> dict:
    """`cli.py fit` then `cli.py test` on the selected checkpoint; returns (and stores) the test results."""
    done = os.path.join(stage_dir, "result.json")
    if os.path.isfile(done):
        with open(done) as f:
            finished = json.load(f)
        if finished.get("args") != base_args:  # a stage of another configuration: never reuse it silently
            raise ValueError(
                f"{done} was written by a run with other arguments (or by an older version that did not record "
                f"them): {finished.get('args')} vs now {base_args}. Use another out_dir, or delete {stage_dir} "
                "to run the stage again.")
        return finished
    from cli import main

    os.makedirs(stage_dir, exist_ok=True)
    logger = ["--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
              f"--trainer.logger.init_args.save_dir={stage_dir}", "--trainer.logger.init_args.name="]
    fit_args = ["fit", *base_args, *logger, "--trainer.logger.init_args.version=fit",
                f"--trainer.default_root_dir={stage_dir}"]
    _append_command(stage_dir, fit_args)
    start = time.time()
    fit = main(fit_args)
    fit_seconds = time.time() - start
    callback = fit.trainer.checkpoint_callback
    if checkpoint == "best" and callback is not None and callback.best_model_path:
        ckpt = callback.best_model_path
    else:  # the final weights, saved explicitly (also when checkpointing is off, e.g. fast_dev_run)
        ckpt = os.path.join(stage_dir, "final.ckpt")
        fit.trainer.save_checkpoint(ckpt)
    drift_cb = _find_drift_callback(fit.trainer)
    drift = drift_cb.summary() if drift_cb is not None else None  # {"id"|"ood_mean": measure -> layer<k> -> value}
    del fit
    test_args = ["test", *base_args, *logger, "--trainer.logger.init_args.version=test", f"--ckpt_path={ckpt}",
                 "--verbose=false"]
    _append_command(stage_dir, test_args)
    test = main(test_args)
    result = {"test": test.model.test_results, "checkpoint": ckpt, "fit_seconds": round(fit_seconds, 1),
              "args": base_args}
    if drift:
        result["drift"] = drift
    atomic_write_json(result, done)
    return result


def _find_drift_callback(trainer) -> Any:
    for cb in trainer.callbacks:
        if type(cb).__name__ == "DriftDiagnosticsCallback":
            return cb
    return None


def _append_command(stage_dir: str, args: list[str]) -> None:
    with open(os.path.join(stage_dir, "commands.sh"), "a") as f:
        f.write("python cli.py " + " ".join(shlex.quote(a) for a in args) + "\n")


def run_protocol(p: W2SProtocol) -> dict:
    os.makedirs(p.out_dir, exist_ok=True)
    with open(os.path.join(p.out_dir, "protocol.json"), "w") as f:
        json.dump(asdict(p), f, indent=2)
    configs = lambda files: [a for path in files for a in ("--config", path)]  # noqa: E731
    raw: dict[str, dict[int, dict]] = {}
    for seed in p.seeds:
        seed_dir = os.path.join(p.out_dir, f"seed{seed}")
        common = [f"--seed_everything={seed}", f"--data.seed={seed}"]
        teacher = run_stage(os.path.join(seed_dir, "teacher"),
                            configs(p.trainer_configs + p.data_configs + p.teacher_configs) + common
                            + ["--data.train_subset=teacher"] + p.teacher_args, p.teacher_checkpoint)
        raw.setdefault("teacher", {})[seed] = teacher
        student_base = (configs(p.trainer_configs + p.data_configs + p.student_configs) + common
                        + ["--data.train_subset=student", f"--data.teacher_checkpoint={teacher['checkpoint']}"]
                        + (["--trainer.callbacks+=callbacks.drift.DriftDiagnosticsCallback"] if p.drift else [])
                        + p.student_args)
        ceiling_results = None
        if p.ceiling:
            ceiling = run_stage(os.path.join(seed_dir, "ceiling"),
                                student_base + ["--data.train_labels=gold",
                                                "--model.objective=lightning_modules.reward.objectives.GoldBradleyTerry"],
                                p.student_checkpoint)
            raw.setdefault("ceiling", {})[seed] = ceiling
            ceiling_results = os.path.join(seed_dir, "ceiling", "ceiling_test.json")
            atomic_write_json({k: v for k, v in ceiling["test"].items() if k != "transfer"}, ceiling_results)
        for method in p.methods:
            extra = [f"--model.ceiling_results={ceiling_results}"] if ceiling_results else []
            raw.setdefault(method.name, {})[seed] = run_stage(
                os.path.join(seed_dir, method.name), student_base + method.cli_args() + extra, p.student_checkpoint)
    from protocols.w2s_report import write_reports

    return write_reports(p, raw)


def parse(args: Optional[list[str]] = None) -> W2SProtocol:
    parser = ArgumentParser(description=__doc__, default_config_files=[])
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(W2SProtocol, as_group=False)
    cfg = parser.parse_args(args)
    d = cfg.as_dict()
    d.pop("config", None)
    d["methods"] = [m if isinstance(m, Method) else Method(**m) for m in d["methods"]]
    return W2SProtocol(**d)


def main(args: Optional[list[str]] = None) -> dict:
    return run_protocol(parse(args))


if __name__ == "__main__":
    main()
