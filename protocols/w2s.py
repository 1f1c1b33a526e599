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
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
import uuid
from contextlib import nullcontext
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Optional, Union

from jsonargparse import ActionConfigFile, ArgumentParser

from lightning_modules.export.hf_classifier import (
    PREFIX as HF_CLASSIFIER, canonical_classifier, check_classifier_options, check_classifier_source,
    classifier_init_args, classifier_source, is_hf_classifier,
)
from lightning_modules.reward.objectives import objective_class_path, resolve_objective_class
from datamodules.atomic_files import atomic_write, atomic_write_json, remove_orphans
from protocols.data_identity import data_identity, rehash_files
from protocols.published_set import withdraw_sets_reading
from protocols.rank_errors import on_rank_zero, rank_zero_section
from protocols.run_files import OutDirLock, is_global_zero, publish_set, read_json
from protocols.stage_identity import StageChangedError  # noqa: F401 -- callers catch it from here
from protocols.stage_identity import (
    ForceSpec, digest, identity_changes, refusal, resolve_cli_config, stage_identity, without_location,
)
from protocols.teacher_search import TeacherSearch, value_label


@dataclass
class Method:
    """One student method: a preference objective, optionally anchored.

    Args:
        name: row name in the results (e.g. "naive", "anchor_lam100").
        objective: the preference objective: a registry name ("naive", "confidence", "gold"), a class name in
            `lightning_modules.reward.objectives` ("SoftBradleyTerry", "ConfidenceW2S", ...) or a dotted path.
        objective_args: its init arguments (e.g. {"aux_coef": 0.5}).
        anchor_coef: ANCHOR's λ (0 = no anchor).
        anchor_layers: anchored depth fractions (1.0 = last layer).
        args: extra `cli.py` arguments for this method's stages.
        sweep: one hyperparameter the method sweeps, {"--model.<flag>": [values]}: one stage per value
            (`<name>@<flag>=<value>`), and one row, the value chosen per seed by the protocol's model-selection
            rule (`protocols.model_selection`: `id_val`, and `oracle_target` reported beside it as an upper bound).
        from_method: evaluate an earlier method's checkpoints instead of fitting: `cli.py validate` + `cli.py test`
            with this method's arguments (WiSE-FT: `--model.wise_ft_alpha`). Costs evaluations only. A swept source
            gives, per seed, its `id_val` pick (WiSE-FT of the selected ANCHOR student); the result names the stage
            it evaluated (`evaluated`).
        checkpoint: "best" or "last", overriding the protocol's `student_checkpoint` for this method: "best" with
            frequent validation is early stopping on the ID validation split.
    """

    name: str
    objective: str = "SoftBradleyTerry"
    objective_args: dict = field(default_factory=dict)
    anchor_coef: float = 0.0
    anchor_layers: list[float] = field(default_factory=lambda: [1.0])
    args: list[str] = field(default_factory=list)
    sweep: dict = field(default_factory=dict)
    from_method: Optional[str] = None
    checkpoint: Optional[str] = None

    def __post_init__(self) -> None:
        if len(self.sweep) > 1:
            raise ValueError(f"method {self.name!r}: sweep takes one flag (one hyperparameter per row), got "
                             f"{sorted(self.sweep)}")
        for flag, values in self.sweep.items():
            if not re.fullmatch(r"--(model|data|trainer)\.[A-Za-z0-9_.]+", flag):
                raise ValueError(f"method {self.name!r}: sweep key {flag!r} is not a cli.py flag like "
                                 "'--model.anchor_coef'")
            if not isinstance(values, list) or not values:
                raise ValueError(f"method {self.name!r}: sweep {flag} needs a non-empty list of values")
            labels = [value_label(v) for v in values]
            if len(set(labels)) != len(labels):
                raise ValueError(f"method {self.name!r}: sweep {flag} repeats a value: {values}")
        if self.checkpoint not in (None, "best", "last"):
            raise ValueError(f"method {self.name!r}: checkpoint must be 'best' or 'last', got {self.checkpoint!r}")

    @property
    def sweep_flag(self) -> Optional[str]:
        return next(iter(self.sweep), None)

    def variants(self) -> list[tuple[str, Any, list[str]]]:
        """(stage name, swept value, extra arguments) per stage of the method; one (name, None, []) unswept."""
        if not self.sweep:
            return [(self.name, None, [])]
        flag = self.sweep_flag
        short = flag.rsplit(".", 1)[-1]
        return [(f"{self.name}@{short}={value_label(v)}", v, [f"{flag}={json.dumps(v)}"]) for v in self.sweep[flag]]

    def objective_class_path(self) -> str:
        """The dotted path `--model.objective` takes, whatever form `objective` was given in."""
        try:
            return objective_class_path(self.objective)
        except ValueError as err:
            raise ValueError(f"method {self.name!r}: objective: {err}") from None

    def cli_args(self) -> list[str]:
        objective = {"class_path": self.objective_class_path(), "init_args": self.objective_args}
        return [f"--model.objective={json.dumps(objective)}", f"--model.anchor_coef={self.anchor_coef}",
                f"--model.anchor_layers={json.dumps(self.anchor_layers)}", *self.args]


MODEL_OPTIONS = ("objective", "objective_args", "anchor_coef", "anchor_layers")  # what a checkpoint's hparams fix


def _default(cls, name: str) -> Any:
    f = next(f for f in fields(cls) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default


@dataclass
class W2SProtocol:
    """Protocol configuration.

    Args:
        out_dir: where stages, results and figures go.
        trainer_configs: `cli.py` config files with the trainer settings (shared by all stages).
        data_configs: config files of the PreferenceDataModule (source, OOD targets, ...).
        student_configs: config files of the strong student model (shared by the ceiling and every method).
        methods: the student methods.
        teacher_configs: config files of the weak teacher model (trained on gold labels of the teacher half);
            empty with `teacher_pretrained`.
        teacher_pretrained: an outside reward model as the teacher, "hf_classifier:<dir or hub id>" (any
            `…ForSequenceClassification` with one output, e.g. a `cli.py export` directory): not trained; its
            stage only runs `cli.py test` (ID + OOD splits) and the students' weak labels are its margins. It is
            scored with its own head and tokenizer, as `cli.py test --model.backbone hf_classifier:<dir>` does;
            `teacher_args` still apply (data and trainer flags; model flags other than these are refused).
        zero_shot: outside reward models ("hf_classifier:<dir or hub id>") tested as is on every split, with
            WRG / AOG / NTS against the teacher on the same pairs: extra rows `zero_shot_<directory name>`.
        zero_shot_args: extra `cli.py` arguments of the zero-shot stages (data flags that must match the other
            stages', e.g. `--data.max_length`).
        seeds: one teacher, one label set, one ceiling and one student per method, per seed.
        ceiling: train the ceiling (student on gold labels of the student half) and report PGR.
        teacher_args: extra `cli.py` arguments of the teacher stages.
        student_args: extra `cli.py` arguments of the ceiling and student stages.
        teacher_checkpoint: "best" (by gold validation accuracy; the teacher is trained on gold labels) or "last".
        teacher_search: the weak teacher's fitted recipe (`protocols.teacher_search`, docs/teacher_structure.md):
            the teacher stage fits one teacher per candidate value of a knob and keeps the one whose structure on the
            validation split (read with the response-only shortcut probe) is closest to the target; the choice,
            every candidate's figures and the chosen teacher's structure go to the stage's result.json and the
            table. null: the teacher is fitted once, as `teacher_args` say.
        student_checkpoint: "last" (default: selecting students on gold validation labels would leak gold
            supervision into W2S) or "best".
        drift: add the drift-diagnostics callback to student stages and report its final values.
        paired_reference: the method every other is compared with, seed by seed (NTS(reference) − NTS(X), mean and
            95% interval); a list: one paired table per reference, the first the headline (`paired` in
            results.json; all in `paired_by_reference`); null: no paired table. A name that is not a method is
            refused, except the default "anchor" when no method is named so (then no paired table).
        results_name: the folder of this configuration's published set, `<out_dir>/<results_name>/`. The default
            "results" is linked as `<out_dir>/results.md|json|csv`, `protocol.json`, `figures`; another name as
            `<out_dir>/<results_name>.md|json|csv`. Two configurations that share an out_dir (and so reuse each
            other's stages) each need their own name: a set belongs to the configuration that made it, and another
            one is refused before any work rather than replacing its rows (docs/reruns.md).
    """

    out_dir: str
    trainer_configs: list[str]
    data_configs: list[str]
    student_configs: list[str]
    methods: list[Method]
    teacher_configs: list[str] = field(default_factory=list)
    teacher_pretrained: Optional[str] = None
    zero_shot: list[str] = field(default_factory=list)
    zero_shot_args: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    ceiling: bool = True
    teacher_args: list[str] = field(default_factory=list)
    student_args: list[str] = field(default_factory=list)
    teacher_checkpoint: str = "best"
    teacher_search: Optional[TeacherSearch] = None
    student_checkpoint: str = "last"
    drift: bool = True
    paired_reference: Union[str, list[str], None] = "anchor"
    results_name: str = "results"

    def __post_init__(self) -> None:
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names):
            raise ValueError(f"--methods has duplicate names: {names}")
        reserved = {"teacher", "ceiling"} & set(names)
        if reserved:
            raise ValueError(f"--methods may not be named {sorted(reserved)} (reserved rows)")
        self._check_outside_models(names)
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", n)]
        if bad:  # a method's name is its stage folder, which a forced rerun deletes: never a path
            raise ValueError(f"--methods names must be plain folder names (letters, digits, _ . -), got {bad}")
        for i, method in enumerate(self.methods):
            method.objective_class_path()  # an unknown objective fails here, naming the method
            if method.from_method is not None:
                earlier = {m.name: m for m in self.methods[:i]}
                source = earlier.get(method.from_method)
                if source is None or source.from_method:
                    raise ValueError(f"method {method.name!r}: from_method {method.from_method!r} must name an "
                                     "earlier method that fits its checkpoints (not one that evaluates another's)")
                own = [k for k in MODEL_OPTIONS if getattr(method, k) != _default(Method, k)]
                if own:  # the checkpoint's hyperparameters build the model: the source's options, not its own
                    raise ValueError(f"method {method.name!r} evaluates {method.from_method!r}'s checkpoints, whose "
                                     f"model options it takes: drop its own {own}")
        for flag in ("teacher_checkpoint", "student_checkpoint"):
            if getattr(self, flag) not in ("best", "last"):
                raise ValueError(f"--{flag} must be 'best' or 'last', got {getattr(self, flag)!r}")
        if not self.seeds:
            raise ValueError("--seeds must list at least one seed")
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if repeated:  # the table would say "over N seeds" of fewer runs
            raise ValueError(f"--seeds repeats {repeated}: {self.seeds}; each seed is one run of every stage, list "
                             "it once")
        self._check_paired_reference(names)
        self._check_results_name(names)
        if self.teacher_pretrained and self.teacher_configs:
            raise ValueError("give either --teacher_configs (a teacher trained here) or --teacher_pretrained (an "
                             f"outside model tested as is), not both: got {self.teacher_configs} and "
                             f"{self.teacher_pretrained!r}")
        if self.teacher_search is not None and self.teacher_pretrained:
            raise ValueError("--teacher_search fits the teacher, --teacher_pretrained tests an outside one as is: "
                             "give one of them")
        if not self.teacher_pretrained and not self.teacher_configs:
            raise ValueError("--teacher_configs is empty: give the teacher's model config files, or an outside "
                             "teacher as --teacher_pretrained hf_classifier:<dir or hub id>")
        for path in [*self.trainer_configs, *self.data_configs, *self.teacher_configs, *self.student_configs]:
            if not os.path.isfile(path):
                raise ValueError(f"config file {path!r} does not exist")

    def _check_paired_reference(self, method_names: list[str]) -> None:
        if self.paired_reference is None:
            return
        references = self.paired_reference if isinstance(self.paired_reference, list) else [self.paired_reference]
        if self.paired_reference == _default(W2SProtocol, "paired_reference") and references[0] not in method_names:
            return  # the default names ANCHOR's usual row; a protocol without one has no paired table
        unknown = [r for r in references if r not in method_names]
        if unknown or not references:
            raise ValueError(f"--paired_reference {self.paired_reference!r}: {unknown or 'an empty list'} names no "
                             f"method; the methods are {method_names} (null: no paired table)")

    def _check_results_name(self, method_names: list[str]) -> None:
        name = self.results_name
        taken = {"logs", "figures", *method_names} | {f"seed{s}" for s in self.seeds}
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or name in taken or name.endswith(".stale"):
            raise ValueError(f"--results_name {name!r} must be a plain folder name (letters, digits, _ . -) that no "
                             f"stage or seed folder of the out_dir uses ({sorted(taken)})")

    def _check_outside_models(self, method_names: list[str]) -> None:
        """Outside models: the `hf_classifier:` prefix, a directory that holds a classifier (before any work), one
        absolute path whatever the working directory, and zero-shot row names that collide with nothing."""
        if self.teacher_pretrained is not None:
            self.teacher_pretrained = _outside_model(self.teacher_pretrained, "--teacher_pretrained")
        self.zero_shot = [_outside_model(m, "--zero_shot") for m in self.zero_shot]
        names = [zero_shot_name(m) for m in self.zero_shot]
        clash = sorted({n for n in names if names.count(n) > 1 or n in method_names})
        if clash:
            raise ValueError(f"--zero_shot: the row names {clash} (zero_shot_<directory or hub name>) repeat or are "
                             "method names; give the models distinct directory names")


def _outside_model(spec: str, flag: str) -> str:
    if not is_hf_classifier(spec):
        raise ValueError(f"{flag} {spec!r}: give an outside reward model as '{HF_CLASSIFIER}<dir or hub id>'")
    check_classifier_source(spec, flag)
    return canonical_classifier(spec)


def zero_shot_name(spec: str) -> str:
    """The row and stage folder of a zero-shot model: `zero_shot_` + its directory's (or hub id's) last part."""
    base = os.path.basename(classifier_source(spec).rstrip("/")) or "model"
    return "zero_shot_" + re.sub(r"[^A-Za-z0-9_.-]", "_", base)


def outside_model_args(spec: str, extra: list[str]) -> list[str]:
    """The `cli.py` arguments of an outside classifier's stage: `cli.py test --model.backbone hf_classifier:X
    --model.tokenizer X` (the arguments the weak labels build it from: `classifier_init_args`). The `extra` stage
    arguments go after the class (so `--model.*` flags among them parse) and before the model's own two, which win."""
    return ["--model.class_path=lightning_modules.reward.reward_model.RewardModelModule", *extra,
            *[f"--model.{k}={v}" for k, v in classifier_init_args(spec).items()]]


# ---- the stages -------------------------------------------------------------------------------------------------
@dataclass
class Stage:
    """One `cli.py fit` + `cli.py test` of the protocol, in `<out_dir>/seed<k>/<name>`.

    `args` leave out the paths of upstream outputs (`upstream`: the stages of the same seed it reads): they are
    added when those stages are done, and their identities stand for them in this stage's identity.
    """

    seed: int
    name: str  # "teacher", "ceiling" or a method's name
    role: str  # for messages: "weak teacher", "ceiling", "method 'anchor'"
    dir: str
    args: list[str]
    checkpoint: str
    upstream: tuple[str, ...] = ()
    pretrained: Optional[str] = None  # an outside model tested as is: the stage runs `cli.py test` only
    search: Optional[TeacherSearch] = None  # the teacher's fitted recipe: a fit per candidate, one kept
    method: Optional[str] = None  # the row a student stage belongs to (a swept method has one stage per value)
    value: Any = None  # its swept value
    evaluates: Optional[str] = None  # a method of the same seed whose checkpoint this one only evaluates
    source_args: dict = field(default_factory=dict)  # its stages' own arguments (a swept source: the value's flag)
    config: Optional[dict] = field(default=None, repr=False)  # resolved by `validate_stage`
    data: Optional[dict] = field(default=None, repr=False)  # what its data options hold (`_identity`)

    @property
    def result_path(self) -> str:
        return os.path.join(self.dir, "result.json")

    def location_args(self, version: str, folder: Optional[str] = None) -> list[str]:
        """Where the run writes (left out of the identity): TensorBoard `<stage>/<version>`, checkpoints (in
        `folder`, default the stage's). No placeholder HPARAMS session per run: the protocol writes one per stage
        with its scores (protocols.hparams)."""
        folder = folder or self.dir
        return ["--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
                "--trainer.logger.init_args.default_hp_metric=false",
                f"--trainer.logger.init_args.save_dir={folder}", "--trainer.logger.init_args.name=",
                f"--trainer.logger.init_args.version={version}", f"--trainer.default_root_dir={folder}"]


def plan_stages(p: W2SProtocol) -> list[Stage]:
    """Every stage of every seed, in run order (a stage's upstream stages come before it)."""
    configs = lambda files: [a for path in files for a in ("--config", path)]  # noqa: E731
    stages = []
    for seed in p.seeds:
        seed_dir = os.path.join(p.out_dir, f"seed{seed}")
        common = [f"--seed_everything={seed}", f"--data.seed={seed}"]
        teacher = (configs(p.trainer_configs + p.data_configs + p.teacher_configs) + common
                   + ["--data.train_subset=teacher"])
        if p.teacher_pretrained:  # tested as is; a --model.tokenizer of teacher_args yields to the model's own
            stages.append(Stage(seed, "teacher", "outside teacher", os.path.join(seed_dir, "teacher"),
                                teacher + outside_model_args(p.teacher_pretrained, p.teacher_args), PRETRAINED,
                                pretrained=p.teacher_pretrained))
        else:
            teacher += p.teacher_args
            stages.append(Stage(seed, "teacher", "weak teacher", os.path.join(seed_dir, "teacher"), teacher,
                                p.teacher_checkpoint, search=p.teacher_search))
        student = (configs(p.trainer_configs + p.data_configs + p.student_configs) + common
                   + ["--data.train_subset=student"]
                   + (["--trainer.callbacks+=callbacks.drift.DriftDiagnosticsCallback"] if p.drift else [])
                   + p.student_args)
        if p.ceiling:
            gold = ["--data.train_labels=gold",
                    "--model.objective=lightning_modules.reward.objectives.GoldBradleyTerry"]
            stages.append(Stage(seed, "ceiling", "ceiling", os.path.join(seed_dir, "ceiling"), student + gold,
                                p.student_checkpoint, ("teacher",)))
        by_name = {m.name: m for m in p.methods}
        for m in p.methods:
            upstream = ("teacher", "ceiling") if p.ceiling else ("teacher",)
            model_args, source_args = m.cli_args(), {}
            if m.from_method:  # every stage of the source: a swept one's pick is known only when all have run
                source = by_name[m.from_method]
                source_args = {name: extra for name, _, extra in source.variants()}
                upstream += tuple(source_args)
                model_args = source.cli_args() + m.args  # what its checkpoints were fitted with (the CLI's guard)
            for name, value, extra in m.variants():
                role = f"method {m.name!r}" + (f" ({m.sweep_flag}={value})" if m.sweep else "")
                stages.append(Stage(seed, name, role, os.path.join(seed_dir, name), student + model_args + extra,
                                    PRETRAINED if m.from_method else (m.checkpoint or p.student_checkpoint),
                                    upstream, method=m.name, value=value, evaluates=m.from_method,
                                    source_args=source_args))
        for spec in p.zero_shot:  # the student half's data settings, so the teacher's margins are the students'
            name = zero_shot_name(spec)
            args = (configs(p.trainer_configs + p.data_configs) + common + ["--data.train_subset=student"]
                    + outside_model_args(spec, p.zero_shot_args))
            stages.append(Stage(seed, name, f"zero-shot {spec!r}", os.path.join(seed_dir, name), args, PRETRAINED,
                                ("teacher",), pretrained=spec))
    return stages


PRETRAINED = "none (tested as is)"  # the checkpoint choice of a stage that does not fit


def upstream_args(stage: Stage, done: dict[str, dict[int, dict]], evaluated: Optional[str] = None) -> list[str]:
    """The paths of upstream outputs; `evaluated`: the stage an evaluating stage reads (`evaluated_stage`)."""
    args = []
    if "teacher" in stage.upstream:
        args.append(f"--data.teacher_checkpoint={done['teacher'][stage.seed]['checkpoint']}")
    if "ceiling" in stage.upstream:
        args.append(f"--model.ceiling_results={ceiling_results_path(stage)}")
    if evaluated:
        args += [*stage.source_args[evaluated], f"--ckpt_path={done[evaluated][stage.seed]['checkpoint']}"]
    return args


def evaluated_stage(stage: Stage, done: dict[str, dict[int, dict]]) -> str:
    """The stage whose checkpoint an evaluating stage reads: its source method's, or a swept source's `id_val` pick
    in this seed (the same rule, and tie-break, as the source's own row)."""
    from protocols.model_selection import pick, rule_score

    names = list(stage.source_args)
    if len(names) == 1:
        return names[0]
    return names[pick([rule_score(done[n][stage.seed], "id_val", [], f"{os.path.dirname(stage.dir)}/{n}")
                       for n in names])]


def ceiling_results_path(stage: Stage) -> str:
    return os.path.join(os.path.dirname(stage.dir), "ceiling", "ceiling_test.json")


# ---- validation before any work ---------------------------------------------------------------------------------
def validate_stage(stage: Stage) -> None:
    """Resolve the stage's configuration with `cli.py`'s parser and refuse bad settings, building nothing."""
    try:
        stage.config = resolve_cli_config(stage.args + stage.location_args("fit"))
        for value in stage.search.values if stage.search else ():  # every candidate's flags parse
            resolve_cli_config(stage.args + stage.search.candidate_args(value) + stage.location_args("fit"))
        _check_model(stage.config.get("model") or {})
        _check_data(stage.config.get("data") or {})
    except (ValueError, TypeError, OSError) as err:
        raise ValueError(f"stage {stage.dir} ({stage.role}): {err}") from None


def _check_model(model: dict) -> None:
    from lightning_modules.reward.reward_model import _validate, anchor_layer_ids

    a = model.get("init_args") or {}
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


# ---- reuse or run -------------------------------------------------------------------------------------------------
def refuse_changed_stages(stages: list[Stage], force: ForceSpec) -> None:
    """All finished stages whose configuration, checkpoint choice or data changed, named at once before any work
    (changes of upstream stages are known only as they run: `run_or_reuse`); forced stages are announced instead."""
    changed, forced = [], []
    for stage in stages:
        finished = read_json(stage.result_path)
        if finished is None:
            continue
        if force.forces(stage.name, stage.seed):
            forced.append(stage.dir)
            continue
        identity = _identity(stage, {})
        diff = stage_changes(stage, finished, {k: v for k, v in identity.items() if k != "upstream"})
        if diff:
            changed.append((stage.dir, diff))
    if changed:
        raise refusal(changed)
    if forced and is_global_zero():
        print(f"--force: {len(forced)} finished stage(s) will run again: " + ", ".join(forced))


def run_or_reuse(stage: Stage, done: dict[str, dict[int, dict]], force: ForceSpec, forced_runs: set) -> dict:
    """The stage's finished result when its identity is unchanged, else a fresh run. `forced_runs`: (name, seed) of
    the stages forced in this invocation; a stage reading one of them follows it (its old result read old outputs)."""
    identity = _identity(stage, upstream_identity(stage, done))
    forced = force.forces(stage.name, stage.seed) or any((u, stage.seed) in forced_runs for u in stage.upstream)
    finished = read_json(stage.result_path)
    if finished is not None and not forced:
        diff = stage_changes(stage, finished, identity)
        if not diff:
            on_rank_zero(f"sweep {stage.dir}", remove_orphans, stage.dir)  # a dead writer's temps in what we read
            return finished
        raise refusal([(stage.dir, diff)])
    if forced:
        forced_runs.add((stage.name, stage.seed))
    on_rank_zero(f"withdraw the sets that read {stage.dir}", withdraw_sets_reading, os.path.dirname(
        os.path.dirname(stage.dir)), stage_key(stage), "runs again" if finished else "is missing and runs")
    on_rank_zero(f"clear {stage.dir}", clear_stage_dir, stage.dir)
    evaluated = evaluated_stage(stage, done) if stage.evaluates else None
    args = stage.args + upstream_args(stage, done, evaluated)
    if stage.pretrained or stage.evaluates:
        result = run_test_stage(stage, args, identity, evaluated)
    else:
        result = run_stage(stage, args, identity)
    if stage.name == "ceiling":  # the methods' --model.ceiling_results
        on_rank_zero(f"write the ceiling results of {stage.dir}", atomic_write_json,
                     {k: v for k, v in result["test"].items() if k != "transfer"}, ceiling_results_path(stage))
    return result


def stage_changes(stage: Stage, finished: Optional[dict], identity: dict) -> list[str]:
    """`identity_changes`, where a teacher search's options added to the code since the stage ran are no change
    when its recorded candidates show they did not come into play (`teacher_search.replays_the_same`)."""
    from protocols.teacher_search import replays_the_same

    diff = identity_changes(finished, identity)
    added = [line for line in diff if line.startswith("search.") and ": '(absent)' → " in line]
    if stage.search is not None and diff and len(added) == len(diff) and finished.get("teacher_search") \
            and replays_the_same(finished["teacher_search"], stage.search):
        return []
    return diff


def upstream_identity(stage: Stage, done: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """Each upstream stage's part of `stage`'s identity: its identity digest and the run it was."""
    return {name: {"identity": digest(done[name][stage.seed]["identity"]), "run": done[name][stage.seed]["run"]}
            for name in stage.upstream}


def _identity(stage: Stage, upstream: dict) -> dict:
    """`stage_identity`, plus the state of an outside model's files (its path alone, in the config, would not notice
    a new export written to the same directory) and the contents behind its data options (`data_identity`)."""
    from datamodules.preference.weak_labels import checkpoint_key

    model = checkpoint_key(stage.pretrained, "--teacher_pretrained / --zero_shot") if stage.pretrained else None
    if stage.data is None:  # hashed once per stage and run (file hashes are cached across runs too)
        stage.data = data_identity(without_location(stage.config))
    return stage_identity(stage.config, stage.checkpoint, upstream, model=model, data=stage.data,
                          search=asdict(stage.search) if stage.search else None)


def clear_stage_dir(stage_dir: str) -> None:
    """Remove an unfinished or replaced stage's old outputs (logs, checkpoints) before it runs again.

    `result.json` goes first: if the removal is interrupted, the stage reads as unfinished, never as finished.
    """
    result = os.path.join(stage_dir, "result.json")
    if os.path.exists(result):
        os.remove(result)
    if os.path.isdir(stage_dir):
        shutil.rmtree(stage_dir)


def run_stage(stage: Stage, args: list[str], identity: dict) -> dict:
    """`cli.py fit` (once, or once per candidate of the teacher search) then `cli.py test` on the selected
    checkpoint; returns (and, on rank 0, stores) the results."""
    from cli import main

    commands: list[list[str]] = []
    runs: list[str] = []
    extra: dict[str, Any] = {}

    def fit_once(more: list[str], folder: str) -> tuple[Any, str, Optional[float]]:
        fit_args = ["fit", *args, *more, *stage.location_args("fit", folder)]
        commands.append(fit_args)
        _write_commands(stage.dir, commands)
        fit = main(fit_args)
        # One id per run of the stage, the same on every rank: a downstream stage's identity names the run it read.
        runs.append(fit.trainer.strategy.broadcast(uuid.uuid4().hex))
        ckpt = _selected_checkpoint(fit.trainer, stage, folder)
        return fit, ckpt, selected_val_acc(fit.trainer, stage)

    start = time.time()
    if stage.search is not None:
        from protocols.shortcut_probe import measure
        from protocols.teacher_search import run_search

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
        drift = teacher_labels = None
    else:
        fit, ckpt, val_acc = fit_once([], stage.dir)
        drift_cb = _find_drift_callback(fit.trainer)
        # the kept checkpoint's drift ({"id"|"ood_mean": measure -> layer<k> -> …}), not the final weights'
        drift = drift_cb.summary(step=checkpoint_step(ckpt)) if drift_cb is not None else None
        teacher_labels = getattr(fit.datamodule, "manifest", {}).get("teacher_labels")  # the weak labels' errors
        del fit
    fit_seconds = time.time() - start
    test_args = ["test", *args, *stage.location_args("test"), f"--ckpt_path={ckpt}", "--verbose=false"]
    _write_commands(stage.dir, [*commands, test_args])
    test = main(test_args)
    result = {"test": test.model.test_results, "checkpoint": ckpt, "fit_seconds": round(fit_seconds, 1),
              "val_acc": val_acc, "identity": identity, "run": runs[-1], "args": args, **extra}
    if drift:
        result["drift"] = drift
    if teacher_labels:
        result["teacher_labels"] = teacher_labels
    on_rank_zero(f"write {stage.result_path}", atomic_write_json, result, stage.result_path)
    return result


def run_test_stage(stage: Stage, args: list[str], identity: dict, evaluated: Optional[str] = None) -> dict:
    """A stage that fits nothing: an outside model's (`cli.py test` only; "checkpoint" is the model itself,
    `hf_classifier:...`, which the students' `--data.teacher_checkpoint` then takes), or one that evaluates another
    stage's checkpoint (`evaluates`, `--ckpt_path` among `args`: `cli.py validate`, for model selection, then
    `cli.py test`; `evaluated`: that stage's name). Its result has a fitted stage's keys."""
    from cli import main

    commands, val_acc = [], None
    start = time.time()
    if stage.evaluates:
        commands.append(["validate", *args, *stage.location_args("validate"), "--verbose=false"])
        _write_commands(stage.dir, commands)
        validated = main(commands[-1])
        val_acc = round(100.0 * float(validated.trainer.callback_metrics["val/acc"]), 2)
        del validated
    commands.append(["test", *args, *stage.location_args("test"), "--verbose=false"])
    _write_commands(stage.dir, commands)
    test = main(commands[-1])
    run = test.trainer.strategy.broadcast(uuid.uuid4().hex)  # as in `run_stage`: the same id on every rank
    checkpoint = stage.pretrained or next(a.split("=", 1)[1] for a in args if a.startswith("--ckpt_path="))
    result = {"test": test.model.test_results, "checkpoint": checkpoint, "fit_seconds": 0.0,
              "test_seconds": round(time.time() - start, 1), "val_acc": val_acc, "identity": identity, "run": run,
              "args": args, "pretrained": stage.pretrained}
    if evaluated:
        result["evaluated"] = evaluated
    on_rank_zero(f"write {stage.result_path}", atomic_write_json, result, stage.result_path)
    return result


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
    # The final weights, saved explicitly (also when checkpointing is off, e.g. fast_dev_run).
    path = os.path.join(folder or stage.dir, "final.ckpt")
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


# ---- the protocol -------------------------------------------------------------------------------------------------
def prepare(p: W2SProtocol, force: ForceSpec, only: Optional[set[str]] = None) -> list[Stage]:
    """Every stage of every seed and method, planned and validated before any work (`only`: validate just these
    keys, `seed<k>/<name>` — a cluster job checks its own stage and what it reads, not the whole grid)."""
    stages = plan_stages(p)
    force.check({s.name for s in stages})
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


def run_protocol(p: W2SProtocol, force: Optional[ForceSpec] = None, replace_results: bool = False,
                 command: Optional[list[str]] = None) -> dict:
    """Every stage in this process (`--launcher local`), then the results; returns the results (every rank computes
    the same ones). `replace_results`: publish over a set another configuration made (it is withdrawn first).
    `command`: the protocol's arguments, recorded with the published set."""
    force = force or ForceSpec(None)
    stages = prepare(p, force)
    rank0 = is_global_zero()
    with OutDirLock(p.out_dir) if rank0 else nullcontext():  # DDP children run inside rank 0's lock
        refuse_changed_stages(stages, force)
        if rank0:
            claim_results(p, replace_results)
        done: dict[str, dict[int, dict]] = {}
        forced_runs: set = set()
        for i, stage in enumerate(stages):
            if i and stage.seed != stages[i - 1].seed:  # a seed's data: its prefix hidden states are not reused
                _release_stores(stages[i - 1].seed)
            with stage_lock(p.out_dir, stage):
                done.setdefault(stage.name, {})[stage.seed] = run_or_reuse(stage, done, force, forced_runs)
        _release_stores(stages[-1].seed)
        return publish_results(p, stages, done, command)


def results_dir(p: W2SProtocol) -> str:
    return os.path.join(p.out_dir, p.results_name)


def claim_results(p: W2SProtocol, replace: bool) -> None:
    """Before any work: this configuration's set may be published (`published_set`: a set belongs to the
    configuration that made it). `replace`: withdraw another configuration's set instead of refusing."""
    from protocols.published_set import SET_RECORD, refuse_other_owner, withdraw

    folder = results_dir(p)
    if not os.path.isdir(folder):
        return
    if replace:
        withdraw(folder, read_json(os.path.join(folder, SET_RECORD)), "withdrawn by --replace_results on "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}: another configuration publishes here")
        return
    nested = {"methods": _defaults(Method), "teacher_search": _defaults(TeacherSearch)}
    # Adding methods or seeds grows the same configuration's table; dropping or changing one would lose rows.
    refuse_other_owner(folder, asdict(p), _defaults(W2SProtocol), nested, {"methods": "name", "seeds": None},
                       "--results_name")


def _defaults(cls) -> dict[str, Any]:
    """The declared defaults of a dataclass's fields (those that have one)."""
    return {f.name: _default(cls, f.name) for f in fields(cls)
            if f.default is not MISSING or f.default_factory is not MISSING}


def stage_key(stage: Stage) -> str:
    return f"seed{stage.seed}/{stage.name}"


def stage_lock(out_dir: str, stage: Stage):
    """The stage's own lock (`<out_dir>/.stages/seed<k>/<name>/.lock`): cluster jobs run stages of one out_dir at
    once, and a local run must not run a stage a job is running. Global rank 0 holds it."""
    folder = os.path.join(out_dir, ".stages", stage_key(stage))
    return OutDirLock(folder, what="stage") if is_global_zero() else nullcontext()


def publish_results(p: W2SProtocol, stages: list[Stage], done: dict[str, dict[int, dict]],
                    command: Optional[list[str]] = None) -> dict:
    """The table from the finished stages, published (rank 0) as one set: tables, figures, TensorBoard summary and
    HPARAMS tab, the configuration and the stage runs it read (`set.json`), swapped in at once."""
    from protocols.hparams import write_hparams
    from protocols.published_set import remove_stale, stage_entry, write_set_record
    from protocols.w2s_report import result_links, summarize, write_reports

    results = summarize(p, done)
    with rank_zero_section(f"publish the results of {p.out_dir}") as rank0:  # a failure ends every rank at once
        if rank0:
            links = result_links(p.results_name)
            entries = {stage_key(s): stage_entry(p.out_dir, s.result_path, done[s.name][s.seed]) for s in stages}

            def write(folder: str) -> None:
                atomic_write_json(asdict(p), os.path.join(folder, "protocol.json"))
                write_reports(folder, results)
                write_hparams(folder, stages, done, results["id_source"])
                write_set_record(folder, published_command(command), links, entries)

            publish_set(p.out_dir, p.results_name, write, links)
            remove_stale(results_dir(p))
            for legacy in ("summary", "hparams"):  # an older layout's TensorBoard folders: now inside results/
                shutil.rmtree(os.path.join(p.out_dir, legacy), ignore_errors=True)
            print(results["markdown"])
    return results


def published_command(args: Optional[list[str]] = None) -> list[str]:
    """The command that published a set, as a person would type it (for a refusal that names the set's owner);
    `args`: the protocol's arguments (default: this process's)."""
    import sys

    return ["python", "-m", "protocols.w2s", *(sys.argv[1:] if args is None else args)]


def _release_stores(seed: int) -> None:
    """Free the shared stores of a seed's stages (--model.cache_frozen_prefix, --reference.cache_outputs), saying
    how much they held."""
    from lightning_modules.fast.shared_store import release_shared_stores, shared_store_summary

    summary = shared_store_summary()
    if summary and is_global_zero():
        print(f"[stores] seed {seed}: freed {summary}")
    release_shared_stores()


def _parse(args: Optional[list[str]]) -> tuple[W2SProtocol, ForceSpec, dict]:
    from protocols.slurm import SlurmOptions

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
    parser.add_argument("--replace_results", action="store_true",
                        help="publish over a set that another configuration made in <out_dir>/<results_name> (it is "
                             "withdrawn to <results_name>.stale/) instead of refusing")
    ns = parser.parse_args(args)
    d = ns.as_dict()
    d.pop("config", None)
    force = ForceSpec(d.pop("force"))
    modes = {k: d.pop(k) for k in ("launcher", "status", "collect", "stage", "wait", "replace_results")}
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
    from protocols import slurm, w2s_cluster

    protocol, force, modes = _parse(args)
    if modes["status"]:
        rows = w2s_cluster.status(protocol)
        slurm.print_status(rows)
        return rows
    if modes["collect"]:
        return w2s_cluster.collect(protocol)
    if modes["stage"]:
        return w2s_cluster.run_one_stage(protocol, modes["stage"], force)
    if modes["launcher"] == "slurm":
        rows = w2s_cluster.submit(protocol, force, modes["slurm"], wait=modes["wait"])
        slurm.print_status(rows)
        return rows
    return run_protocol(protocol, force=force, replace_results=modes["replace_results"], command=args)


if __name__ == "__main__":
    from protocols.refusals import run_main

    run_main(main)
