"""Before any work, every stage of a W2S protocol is parsed with `cli.py`'s parser and checked: its model options
against the student's backbone, its data sources, the sweep values (docs/w2s.md)."""
from __future__ import annotations

from typing import Optional

from lightning_modules.export.hf_classifier import check_classifier_options, check_classifier_source, is_hf_classifier
from lightning_modules.reward.objectives import resolve_objective_class
from protocols.engine.data_identity import rehash_files
from protocols.engine.stage_identity import ForceSpec, digest, legacy_spelling, resolve_cli_config, without_location
from protocols.w2s.config import W2SProtocol
from protocols.w2s.stages import Stage, plan_stages, stage_key


def prepare(p: W2SProtocol, force: ForceSpec, only: Optional[set[str]] = None) -> list[Stage]:
    """Every stage of every seed and method, planned and validated before any work (`only`: validate just these
    keys, `seed<k>/<name>` — a cluster job checks its own stage and what it reads, not the whole grid)."""
    stages = plan_stages(p)
    force.check({s.name for s in stages}, seeds=p.seeds)
    if force:  # a forced run trusts no cached file hash (a rewrite may have kept size and mtime: docs/reruns.md)
        rehash_files()
    for stage in stages:
        if only is None or stage_key(stage) in only:
            validate_stage(stage)
    refuse_equal_sweep_values(stages)
    return stages


def refuse_equal_sweep_values(stages: list[Stage]) -> None:
    """Two values of a sweep that parse to the same stage (`[1, 1.0]`, `[1000, "1e3"]`) would train it twice and
    count it as two candidates: refused, naming both."""
    seen: dict[tuple, Stage] = {}
    for stage in stages:
        if stage.value is None or stage.config is None:
            continue
        key = (stage.seed, stage.method, digest(without_location(stage.config)))
        if key in seen:
            raise ValueError(f"method {stage.method!r}: the sweep values {seen[key].value!r} and {stage.value!r} give "
                             f"the same stage (stages {seen[key].name} and {stage.name} resolve to one configuration); "
                             "list each value once")
        seen[key] = stage


def validate_stage(stage: Stage) -> None:
    """Resolve the stage's configuration with `cli.py`'s parser and refuse bad settings, building nothing."""
    try:
        stage.config = resolve_cli_config(stage.args + stage.location_args("fit"))
        for value in stage.search.values if stage.search else ():  # every candidate's flags parse
            resolve_cli_config(stage.args + stage.search.candidate_args(value) + stage.location_args("fit"))
        _check_model(stage.config.get("model") or {})
        _check_data(stage.config.get("data") or {})
        if fits(stage):
            refuse_no_training(stage.config.get("trainer") or {}, args_option(stage))
    except (ValueError, TypeError, OSError) as err:
        raise ValueError(f"stage {stage.dir} ({stage.role}): {err}") from None


def fits(stage: Stage) -> bool:
    """Whether the stage trains a model (not an outside or labelling model tested as is, not an evaluation of another
    stage's checkpoint, not an ensemble of others)."""
    return not (stage.pretrained or stage.evaluates or stage.combine)


def args_option(stage: Stage) -> str:
    """The protocol option that holds a stage's trainer flags, for a refusal."""
    return "teacher_args" if stage.is_teacher else f"student_args (or method {stage.method!r}'s args)"


# A fit with one of these makes no optimizer step: the "trained" model would be its random or pretrained start.
NO_STEP_FLAGS = ("max_epochs", "max_steps", "limit_train_batches")


def refuse_no_training(trainer: dict, option: str) -> None:
    """A stage that fits must make optimizer steps: `--trainer.max_epochs=0`, `max_steps=0` or
    `limit_train_batches=0` publish an untrained model as a trained row (and a teacher's labels from it), so they are
    refused before any work, naming the flag and the protocol option that gave it."""
    for flag in NO_STEP_FLAGS:
        value = trainer.get(flag)
        if value is not None and not isinstance(value, bool) and float(value) == 0:
            raise ValueError(f"--trainer.{flag}={value} (in {option}): the fit would make no optimizer step and the "
                             "stage's untrained model would be published (and, for a teacher, label the students); "
                             f"remove it or give --trainer.{flag} a positive value")


def _check_model(model: dict) -> None:
    from lightning_modules.reward.reward_model import _validate, anchor_layer_ids

    a = legacy_spelling({"model": model})["model"].get("init_args") or {}  # an Anchor plug-in as its shorthand
    if "anchor_layers" not in a:  # not a reward model: nothing of ours to check
        return
    if is_hf_classifier(a["backbone"]):  # an outside model scored whole: no layers of ours to anchor
        check_classifier_source(a["backbone"], "--model.backbone")
        check_classifier_options(a["backbone"], **{k: v for k, v in a.items() if k != "backbone"})
        return
    _validate(a["backbone"], a["tokenizer"], a["anchor_coef"], a["anchor_layers"], a["quantization"], a["lora"],
              a["freeze_layers"])
    depth = backbone_layer_count(a)
    if (a.get("freeze_layers") or 0) > depth:  # the module refuses it too, but only once its stage runs
        raise ValueError(f"--model.freeze_layers {a['freeze_layers']} exceeds the depth of --model.backbone "
                         f"{a['backbone']!r}: it has {depth} transformer layer(s); choose 0..{depth}")
    anchor_layer_ids(a["anchor_layers"], depth, a["anchor_coef"], a["freeze_layers"])
    objective = a.get("objective")
    if objective:
        try:  # the objective validates its own arguments (ConfidenceW2S: aux_coef in [0, 1], ...)
            resolve_objective_class(objective["class_path"])(**(objective.get("init_args") or {}))
        except (ValueError, TypeError) as err:
            raise ValueError(f"--model.objective {objective['class_path']}: {err}") from None


def backbone_layer_count(a: dict) -> int:
    """Transformer layers of the model's backbone, from its config alone (no weights are read)."""
    from transformers import AutoConfig

    from datamodules.tokenizers import resolve_pretrained
    from lightning_modules.reward.backbones import is_tiny, tiny_config

    name, keep = a["backbone"], a.get("keep_layers")
    if is_tiny(name):
        cfg = tiny_config(name, vocab_size=8, pad_token_id=0, overrides=a.get("tiny_config"))
    else:
        try:
            cfg = AutoConfig.from_pretrained(resolve_pretrained(name))
        except (OSError, ValueError) as err:
            raise ValueError(f"--model.backbone {name!r}: cannot read its config: {str(err)[:300]}") from None
    n = int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer)
    if keep is not None and not 0 <= keep <= n:
        raise ValueError(f"--model.keep_layers must be in [0, {n}] for {name!r} ({n} layers), got {keep}")
    return n if keep is None else keep


def _check_data(data: dict) -> None:
    from datamodules.preference.sources import is_known_source, known_sources_hint

    a = data.get("init_args") or {}
    if "source" not in a:
        return
    for flag, name in [("--data.source", a["source"])] + [("--data.ood_targets", t) for t in a["ood_targets"]]:
        if not is_known_source(name):
            raise ValueError(f"{flag}: unknown preference source {name!r}; {known_sources_hint()}")
