"""What a W2S stage runs: `cli.py fit` (once, or once per candidate of the teacher search) then `cli.py test` on the
checkpoint it keeps (`run_stage`), or, for a stage that fits nothing, `cli.py validate` + `test` of an outside model
or of another stage's checkpoint (`run_test_stage`). Every command goes to the stage's `commands.sh`; the result to
its `result.json`, atomically, when it is complete."""
from __future__ import annotations

import json
import os
import shlex
import time
import uuid
from typing import Any, Optional

from callbacks.trajectory_guard import find_trajectory_guard
from callbacks.validation_history import find_validation_history
from datamodules.atomic_files import atomic_write, atomic_write_json, remove_path
from protocols.engine.rank_errors import on_rank_zero
from protocols.engine.run_files import is_global_zero, read_json
from protocols.w2s.stages import Stage


def run_stage(stage: Stage, args: list[str], identity: dict) -> dict:
    """`cli.py fit` (once, or once per candidate of the teacher search) then `cli.py test` on the selected
    checkpoint; returns (and, on rank 0, stores) the results."""
    from cli import main

    commands: list[list[str]] = []
    runs: list[str] = []
    extra: dict[str, Any] = {}

    def fit_once(more: list[str], folder: str) -> tuple[Any, str, Optional[float]]:
        fit_args = ["fit", *args, *more, *stage.location_args("fit", folder), *_history_args(stage, folder)]
        commands.append(fit_args)
        _write_commands(stage.dir, commands)
        fit = main(fit_args)
        refuse_untrained(fit.trainer, stage)
        # One id per run of the stage, the same on every rank: a downstream stage's identity names the run it read.
        runs.append(fit.trainer.strategy.broadcast(uuid.uuid4().hex))
        ckpt = _selected_checkpoint(fit.trainer, stage, folder)
        return fit, ckpt, selected_val_acc(fit.trainer, stage)

    start = time.time()
    if stage.search is not None:
        from protocols.w2s.shortcut_probe import measure
        from protocols.w2s.teacher_search import run_search

        def candidate(more: list[str], folder: str) -> tuple[str, Optional[float]]:
            fit, ckpt, val_acc = fit_once(more, folder)
            del fit
            return ckpt, val_acc

        data_init = (stage.config.get("data") or {}).get("init_args") or {}
        max_epochs = (stage.config.get("trainer") or {}).get("max_epochs")
        extra["teacher_search"] = run_search(stage.search, stage.dir, args, data_init, stage.seed, candidate,
                                             max_epochs)
        ckpt = extra["teacher_search"]["checkpoint"]
        val_acc = extra["teacher_search"]["val_acc"]
        args = [*args, *extra["teacher_search"]["chosen_args"]]
        extra["teacher_structure"] = measure(ckpt, data_init, stage.seed)  # the chosen one: report only
        drift = teacher_labels = history = None
    else:
        fit, ckpt, val_acc = fit_once([], stage.dir)
        drift_cb = _find_drift_callback(fit.trainer)
        # the kept checkpoint's drift ({"id"|"ood_mean": measure -> layer<k> -> …}), not the final weights'
        drift = drift_cb.summary(step=checkpoint_step(ckpt)) if drift_cb is not None else None
        teacher_labels = getattr(fit.datamodule, "manifest", {}).get("teacher_labels")  # the weak labels' errors
        history = find_validation_history(fit.trainer)
        if stage.keep_last:  # what a row reading this fit is (`Method.trajectory`): the final weights, their
            # drift, and whether validating less often would have trained them otherwise (`drew`, TrajectoryGuard)
            extra["last"] = {"checkpoint": _final_checkpoint(fit.trainer, stage.dir), "step": fit.trainer.global_step,
                             "drew": find_trajectory_guard(fit.trainer).drew,
                             **({"drift": drift_cb.summary()} if drift_cb is not None else {})}
        del fit
    fit_seconds = time.time() - start
    test_args = ["test", *args, *stage.location_args("test"), f"--ckpt_path={ckpt}", "--verbose=false"]
    _write_commands(stage.dir, [*commands, test_args])
    test = main(test_args)
    result = {"test": test.model.test_results, "checkpoint": ckpt, "fit_seconds": round(fit_seconds, 1),
              "val_acc": val_acc, "identity": identity, "run": runs[-1], "args": args, **extra}
    weights = _teacher_weights(stage, ckpt)
    if weights:  # a multi-teacher student's learned mixture, by teacher (docs/multi_teacher.md)
        result["teacher_weights"] = weights
    if stage.search is None and history is not None:
        result.update(_other_rules(stage, args, ckpt, result["test"], history, commands + [test_args]))
    if drift:
        result["drift"] = drift
    if teacher_labels:
        result["teacher_labels"] = teacher_labels
    on_rank_zero(f"write {stage.result_path}", atomic_write_json, result, stage.result_path)
    if not stage.keep_fit_checkpoints:
        on_rank_zero(f"prune {stage.dir}", prune_checkpoints, stage.dir, kept_checkpoints(result))
    return result


class UntrainedStageError(RuntimeError):
    """A stage's fit made no optimizer step: its model is its start, and nothing of it may be used."""


def refuse_untrained(trainer, stage: Stage) -> None:
    """After a fit, before its checkpoint, labels or rows are used: it made optimizer steps. What the validation
    before any work cannot see (a training split of no batch, `--trainer.max_time` spent before the first step, a
    callback that stops at once) is caught here."""
    if trainer.global_step > 0:
        return
    option = "teacher_args" if stage.is_teacher else "student_args"
    raise UntrainedStageError(
        f"stage {stage.dir} ({stage.role}): its fit made no optimizer step (global step 0), so its model is untrained "
        f"and is not used; check --trainer.max_epochs / --trainer.max_steps / --trainer.limit_train_batches / "
        f"--trainer.max_time in {option} and the size of its training split (its log: {stage.dir}/stage.log)")


def kept_checkpoints(result: Any) -> set[str]:
    """Every checkpoint a finished stage's result names (a "checkpoint" value at any depth): the one it keeps (tested,
    read by downstream stages: WiSE-FT, ensembles, the students' teacher), the `weak_val` rule's, and each teacher
    search candidate's (a reviewer recomputes their figures from them)."""
    if isinstance(result, list):
        return set().union(*(kept_checkpoints(v) for v in result))
    if not isinstance(result, dict):
        return set()
    named = {result["checkpoint"]} if isinstance(result.get("checkpoint"), str) else set()
    return named.union(*(kept_checkpoints(v) for k, v in result.items() if k != "checkpoint"))


def prune_checkpoints(stage_dir: str, keep: set[str]) -> list[str]:
    """Delete every `.ckpt` under a finished stage's folder that its result does not name: the fits' own resume
    points (`last.ckpt`, the twins of the kept one under `fit/checkpoints/`). They are only needed to resume an
    interrupted fit, which a finished stage never is, and they are two thirds of a run's disk (a MiniLM stage:
    3 x 119 MB). Returns the deleted paths.
    `keep_fit_checkpoints: true` in the protocol keeps them."""
    keep = {os.path.realpath(k) for k in keep}
    removed = []
    for folder, _, files in os.walk(stage_dir):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".ckpt") and os.path.realpath(path) not in keep:
                remove_path(path)
                removed.append(path)
    return sorted(removed)


def run_test_stage(stage: Stage, args: list[str], identity: dict, evaluated: Optional[str] = None,
                   members: Optional[list[str]] = None) -> dict:
    """A stage that fits nothing: an outside model's (`cli.py test` only; "checkpoint" is the model itself,
    `hf_classifier:...`, which the students' `--data.teacher_checkpoint` then takes), or one that evaluates another
    stage's checkpoint (`evaluates`, `--ckpt_path` among `args`: `cli.py validate`, for model selection, then
    `cli.py test`; `evaluated`: that stage's name), or an ensemble row's (`combine`: the `members`' checkpoints
    averaged into one first, or scored together). Its result has a fitted stage's keys."""
    from cli import main

    commands, val_acc = [], None
    start = time.time()
    val_weak_acc = None
    if stage.combine == "weights":
        from lightning_modules.reward.weight_averaging import average_checkpoints
        from protocols.w2s.stages import averaged_checkpoint

        on_rank_zero(f"average {len(members)} checkpoints into {averaged_checkpoint(stage)}", average_checkpoints,
                     members, averaged_checkpoint(stage))
    if stage.evaluates or stage.combine:
        commands.append(["validate", *args, *stage.location_args("validate"), "--verbose=false"])
        _write_commands(stage.dir, commands)
        validated = main(commands[-1])
        metrics = validated.trainer.callback_metrics
        val_acc = round(100.0 * float(metrics["val/acc"]), 2)
        if "val/weak_acc" in metrics:  # agreement with the teacher: the weak_val rule
            val_weak_acc = round(100.0 * float(metrics["val/weak_acc"]), 2)
        del validated
    commands.append(["test", *args, *stage.location_args("test"), "--verbose=false"])
    _write_commands(stage.dir, commands)
    test = main(commands[-1])
    run = test.trainer.strategy.broadcast(uuid.uuid4().hex)  # as in `run_stage`: the same id on every rank
    checkpoint = stage.pretrained or next((a.split("=", 1)[1] for a in args if a.startswith("--ckpt_path=")), None)
    result = {"test": test.model.test_results, "checkpoint": checkpoint, "fit_seconds": 0.0,
              "test_seconds": round(time.time() - start, 1), "val_acc": val_acc, "val_weak_acc": val_weak_acc,
              "identity": identity, "run": run, "args": args, "pretrained": stage.pretrained}
    if evaluated:
        result["evaluated"] = evaluated
    if stage.reads:  # what the source's fit measured of the weights it read: the row's drift, the labels' errors
        source = read_json(os.path.join(os.path.dirname(stage.dir), stage.reads, "result.json"))
        result.update({"step": source["last"]["step"], **{k: v for k, v in (
            ("drift", source["last"].get("drift")), ("teacher_labels", source.get("teacher_labels"))) if v}})
    if stage.combine:
        result["evaluated"] = f"{stage.combine} of {len(members)}"
        result["members"] = list(stage.members)
    on_rank_zero(f"write {stage.result_path}", atomic_write_json, result, stage.result_path)
    return result


def _history_args(stage: Stage, folder: str) -> list[str]:
    """The `ValidationHistory` callback of a student fit (not of a teacher-search candidate): every validation's
    two accuracies; the `val/weak_acc`-best checkpoint of an early-stopping stage (the `weak_val` rule's stopping
    point); every validation's checkpoint of a same-step stage. Location-like: no part of the stage's identity
    (it changes no training), so it is added here, beside the logger's folders."""
    if stage.search is not None or stage.is_teacher:
        return []
    init = {"dirpath": os.path.join(folder, "rule_checkpoints"), "keep_weak_best": stage.checkpoint == "best",
            "keep_every": stage.keep_every}
    guard = [{"class_path": "callbacks.trajectory_guard.TrajectoryGuard"}] if stage.keep_last else []
    return ["--trainer.callbacks+=" + json.dumps(c) for c in [
        {"class_path": "callbacks.validation_history.ValidationHistory", "init_args": init}, *guard]]


def _other_rules(stage: Stage, args: list[str], ckpt: str, test: dict, history, commands: list[list[str]]) -> dict:
    """What the rules other than `id_val` read from a fit: every validation (`validations`), the kept checkpoint's
    agreement with the teacher (`val_weak_acc`), the `weak_val` stopping point's checkpoint and its test results
    (`weak_val`, an early-stopping stage: tested only when it is not the `id_val` one), and the test results at every
    validation (`by_step`, a same-step stage). The extra checkpoints are deleted once tested."""
    from cli import main

    step = checkpoint_step(ckpt)
    kept = history.at_step(step) or (history.history[-1] if history.history else {})
    out: dict[str, Any] = {"validations": history.history, "step": step, "val_weak_acc": kept.get("val_weak_acc")}

    def test_at(path: str, version: str) -> dict:
        test_args = ["test", *args, *stage.location_args(version), f"--ckpt_path={path}", "--verbose=false"]
        commands.append(test_args)
        _write_commands(stage.dir, commands)
        return main(test_args).model.test_results

    weak = history.weak_best
    if stage.checkpoint == "best" and weak is not None:
        same = weak["step"] == step
        out["weak_val"] = {"step": weak["step"], "val_acc": weak["val_acc"], "val_weak_acc": weak["val_weak_acc"],
                           "checkpoint": ckpt if same else weak["checkpoint"],
                           "test": test if same else test_at(weak["checkpoint"], "test_weak_val")}
        weights = _teacher_weights(stage, out["weak_val"]["checkpoint"])
        if weights:
            out["weak_val"]["teacher_weights"] = weights
    if stage.keep_every:
        out["by_step"] = {str(e["step"]): {"val_acc": e["val_acc"], "val_weak_acc": e["val_weak_acc"],
                                           "test": test if e["step"] == step else test_at(e["checkpoint"],
                                                                                          f"test_step{e['step']}")}
                          for e in history.history}
        for e in history.history:
            on_rank_zero(f"remove {e['checkpoint']}", remove_path, e["checkpoint"])
    return out


def _teacher_weights(stage: Stage, ckpt: str) -> Optional[dict[str, float]]:
    """The simplex weights a multi-teacher student's checkpoint holds, by teacher name; None for any other stage."""
    if not stage.teachers:
        return None
    from protocols.w2s.multi_teacher import checkpoint_teacher_weights

    return checkpoint_teacher_weights(ckpt, stage.teachers)


def selected_val_acc(trainer, stage: Stage) -> Optional[float]:
    """The ID validation accuracy (percent) of the checkpoint the stage keeps: the best one's score, or the last
    validation's (run after the last training step) for "last". The model-selection rule `id_val` reads it."""
    callback = trainer.checkpoint_callback
    if stage.checkpoint == "best" and callback is not None and callback.best_model_score is not None:
        return round(100.0 * float(callback.best_model_score), 2)
    value = trainer.callback_metrics.get("val/acc")
    return None if value is None else round(100.0 * float(value), 2)


def _selected_checkpoint(trainer, stage: Stage, folder: Optional[str] = None) -> str:
    callback = trainer.checkpoint_callback
    if stage.checkpoint == "best" and callback is not None and callback.best_model_path:
        return callback.best_model_path  # the same path on every rank (ModelCheckpoint broadcasts its folder)
    return _final_checkpoint(trainer, folder or stage.dir)


def _final_checkpoint(trainer, folder: str) -> str:
    """The final weights, saved explicitly (also when checkpointing is off, e.g. fast_dev_run; and `last.ckpt` is
    not them: Lightning writes it only beside a new best one)."""
    path = os.path.join(folder, "final.ckpt")
    trainer.save_checkpoint(path)  # every rank takes part; rank 0 writes it whole (AtomicCheckpointIO)
    trainer.strategy.barrier("final.ckpt")  # every rank's test run loads it next
    return path


def checkpoint_step(path: str) -> int:
    """The global step a checkpoint was saved at (memory-mapped: the weights are not read)."""
    import torch

    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=False)["global_step"])


def _find_drift_callback(trainer) -> Any:
    for cb in trainer.callbacks:
        if type(cb).__name__ == "DriftDiagnosticsCallback":
            return cb
    return None


def _write_commands(stage_dir: str, commands: list[list[str]]) -> None:
    on_rank_zero(f"write {stage_dir}/commands.sh", atomic_write, os.path.join(stage_dir, "commands.sh"),
                 "".join("python cli.py " + " ".join(shlex.quote(a) for a in c) + "\n" for c in commands))


def release_stores(seed: int) -> None:
    """Free the shared stores of a seed's stages (--model.cache_frozen_prefix, --reference.cache_outputs), saying
    how much they held."""
    from lightning_modules.fast.shared_store import release_shared_stores, shared_store_summary

    summary = shared_store_summary()
    if summary and is_global_zero():
        print(f"[stores] seed {seed}: freed {summary}")
    release_shared_stores()
