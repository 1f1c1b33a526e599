"""The W2S protocol's stages: what each one is (`Stage`), the plan of every stage of every seed (`plan_stages`), what
a stage reads from its upstream stages, and its identity (`identity_of`: what a rerun compares).

    teacher (gold, teacher half) [-> extra teachers (gold, teacher half)] -> soft labels on the student half
    -> ceiling (gold, student half) -> every student method (a swept one: a stage per value; an evaluating one:
    `cli.py validate` + `test` of another method's checkpoint) -> zero-shot rows of outside models
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from protocols.engine.data_identity import data_identity
from protocols.engine.stage_identity import digest, identity_changes, stage_identity, without_location
from protocols.w2s.teacher_search import TeacherSearch
from protocols.w2s.config import W2SProtocol, outside_model_args, zero_shot_name


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
    keep_every: bool = False  # test the checkpoint of every validation (the same-step comparison: `by_step`)
    members: tuple[str, ...] = ()  # an ensemble row's member stages (their checkpoints), combined by `combine`
    combine: Optional[str] = None  # "weights" (WARM) or "predictions"
    extra_teacher: bool = False  # one of the protocol's extra teachers (fitted like the main one)
    extra_teachers: tuple[str, ...] = ()  # extra teachers whose labels it reads (--data.extra_teacher_checkpoints)
    keep_fit_checkpoints: bool = False  # keep the fit's resume points once the stage is finished (protocol option)
    reads: Optional[str] = None  # a stage of the same seed whose fit this one is (`Method.trajectory`): its last
    keep_last: bool = False  # an early-stopping student fit: it keeps its final weights too, for a row `reads`
    config: Optional[dict] = field(default=None, repr=False)  # resolved by `validate_stage`
    data: Optional[dict] = field(default=None, repr=False)  # what its data options hold (`_identity`)

    @property
    def result_path(self) -> str:
        return os.path.join(self.dir, "result.json")

    @property
    def is_teacher(self) -> bool:
        """The main teacher or an extra one: fitted on the teacher half's gold labels, with no teacher of its own."""
        return self.name == "teacher" or self.extra_teacher

    @property
    def teachers(self) -> tuple[str, ...]:
        """The teachers whose labels its training batches carry, in column order (the main teacher first)."""
        return ("teacher", *self.extra_teachers) if self.extra_teachers else ()

    def location_args(self, version: str, folder: Optional[str] = None) -> list[str]:
        """Where the run writes (left out of the identity): TensorBoard `<stage>/<version>`, checkpoints (in
        `folder`, default the stage's). No placeholder HPARAMS session per run: the protocol writes one per stage
        with its scores (protocols.w2s.hparams)."""
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
        if p.teacher_labeller:  # a labelling function: `cli.py test` of its margins on the students' pairs
            args = (configs(p.trainer_configs + p.data_configs) + common + ["--data.train_subset=student"]
                    + labeller_args(p.teacher_labeller) + [a for a in p.student_args if a.startswith("--data.")]
                    + p.teacher_args)
            stages.append(Stage(seed, "teacher", "labelling-function teacher", os.path.join(seed_dir, "teacher"),
                                args, PRETRAINED, pretrained=p.teacher_labeller))
        elif p.teacher_pretrained:  # tested as is; a --model.tokenizer of teacher_args yields to the model's own
            stages.append(Stage(seed, "teacher", "outside teacher", os.path.join(seed_dir, "teacher"),
                                teacher + outside_model_args(p.teacher_pretrained, p.teacher_args), PRETRAINED,
                                pretrained=p.teacher_pretrained))
        else:
            teacher += p.teacher_args
            stages.append(Stage(seed, "teacher", "weak teacher", os.path.join(seed_dir, "teacher"), teacher,
                                p.teacher_checkpoint, search=p.teacher_search))
        for extra in p.extra_teachers:  # the main teacher's settings and its own arguments; no search
            stages.append(Stage(seed, extra.name, f"extra teacher {extra.name!r}", os.path.join(seed_dir, extra.name),
                                teacher + extra.args, p.teacher_checkpoint, extra_teacher=True))
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
        n_teachers = 1 + len(p.extra_teachers)
        of_seed: dict[str, Stage] = {}
        for m in _fit_order(p):
            if m.ensemble is not None:
                stages.append(_ensemble_stage(p, m, by_name, seed, seed_dir, student))
                continue
            if m.trajectory:
                reads = m.variants_of(by_name[m.trajectory])  # value by value
                stages += [_reader_stage(m, name, value, of_seed[reads[name]], seed_dir)
                           for name, value, _ in m.variants()]
                continue
            upstream = ("teacher", "ceiling") if p.ceiling else ("teacher",)
            model_args, source_args = m.cli_args(n_teachers), {}
            if m.from_method:  # every stage of the source: a swept one's pick is known only when all have run
                source = by_name[m.from_method]
                source_args = {name: extra for name, _, extra in source.variants()}
                upstream += tuple(source_args)
                model_args = fitted(source, by_name).cli_args(n_teachers) + m.args  # its checkpoints were fitted so
            for name, value, extra in m.variants():
                role = f"method {m.name!r}" + (f" ({m.sweep_flag}={value})" if m.sweep else "")
                extras, labels = label_arguments(p, m, value)
                stages.append(Stage(seed, name, role, os.path.join(seed_dir, name),
                                    student + model_args + extra + labels,
                                    PRETRAINED if m.from_method else (m.checkpoint or p.student_checkpoint),
                                    upstream + extras, method=m.name, value=value, evaluates=m.from_method,
                                    source_args=source_args, keep_every=m.test_every_validation,
                                    extra_teachers=extras, keep_last=not m.from_method
                                    and (m.checkpoint or p.student_checkpoint) == "best"))
                of_seed[name] = stages[-1]
        for spec in p.zero_shot:  # the student half's data settings, so the teacher's margins are the students'
            name = zero_shot_name(spec)
            args = (configs(p.trainer_configs + p.data_configs) + common + ["--data.train_subset=student"]
                    + outside_model_args(spec, p.zero_shot_args))
            stages.append(Stage(seed, name, f"zero-shot {spec!r}", os.path.join(seed_dir, name), args, PRETRAINED,
                                ("teacher",), pretrained=spec))
    for stage in stages:
        stage.keep_fit_checkpoints = p.keep_fit_checkpoints
    return stages


def _fit_order(p: W2SProtocol) -> list:
    """The methods with stages, in their order, except that a fit other methods read (`Method.trajectory`) comes
    right before the first of its readers: its stages run first. The table keeps the methods' order
    (`model_selection.select`)."""
    by_name, out = {m.name: m for m in p.methods}, []
    for m in p.stage_methods():
        for method in ([by_name[m.trajectory]] if m.trajectory else []) + [m]:
            if method not in out:
                out.append(method)
    return out


def fitted(m, by_name: dict):
    """The method whose fit a method's checkpoints are: its own, or a trajectory reader's source."""
    return by_name[m.trajectory] if m.trajectory else m


def _reader_stage(m, name: str, value, source: Stage, seed_dir: str) -> Stage:
    """A stage of a method that reads another's fit: that fit's arguments (its data, model and trainer options: the
    validate + test runs are the source's), its final weights (`upstream_args`), the source stage upstream."""
    role = f"method {m.name!r}" + (f" ({m.sweep_flag}={value})" if m.sweep else "") + f": {source.name}'s final weights"
    return Stage(source.seed, name, role, os.path.join(seed_dir, name), list(source.args), "last",
                 (*source.upstream, source.name), method=m.name, value=value, evaluates=m.trajectory,
                 source_args={source.name: []}, extra_teachers=source.extra_teachers, reads=source.name)


def label_arguments(p: W2SProtocol, m, value) -> tuple[tuple[str, ...], list[str]]:
    """The extra teachers a method's stage reads (their checkpoints: upstream outputs, `upstream_args`) and its own
    label arguments. A multi-teacher objective reads them all; a student of one extra teacher reads them all too, and
    trains on that one's column (`--data.label_teacher k`: the multi-teacher student's data, at the vertex k of the
    simplex; every teacher's stage then has a configuration of its own); a student of the main teacher reads none."""
    extras = tuple(e.name for e in p.extra_teachers)
    if m.from_method is not None:
        return (), []
    if m.uses_teacher_labels:
        return extras, []
    teacher = m.label_teacher(value)
    if teacher is None:
        return (), []
    return extras, [f"--data.label_teacher={1 + extras.index(teacher)}"]


PRETRAINED = "none (tested as is)"  # the checkpoint choice of a stage that does not fit
ENSEMBLE_CLASS = "lightning_modules.reward.ensemble.RewardEnsembleModule"
LABELLER_CLASS = "lightning_modules.reward.labeller_teacher.LabellerTeacherModule"


def labeller_args(spec: str) -> list[str]:
    """A labelling-function teacher's stage: its margins, from the data module's label file, tested as a model."""
    return [f"--data.teacher_checkpoint={spec}", f"--model.class_path={LABELLER_CLASS}",
            f"--model.init_args.labeller={spec}"]


def _ensemble_stage(p: W2SProtocol, m, by_name: dict, seed: int, seed_dir: str, student: list[str]) -> Stage:
    """An evaluation-only stage over every stage of the named methods. Weight averaging tests the averaged checkpoint
    under its first member's arguments (the average carries that member's hyperparameters, which the CLI's
    `--ckpt_path` guard compares); a prediction ensemble runs the ensemble class over the members' checkpoints."""
    members = [(source, name, extra) for source in m.ensemble["of"] for name, _, extra in by_name[source].variants()]
    upstream = (("teacher", "ceiling") if p.ceiling else ("teacher",)) + tuple(name for _, name, _ in members)
    if m.ensemble["by"] == "weights":
        first, _, extra = members[0]
        args = student + fitted(by_name[first], by_name).cli_args(1 + len(p.extra_teachers)) + extra
    else:
        # the members are upstream outputs, added when they are done (`upstream_args`); [] stands for them here
        args = student + [f"--model.class_path={ENSEMBLE_CLASS}", "--model.init_args.members=[]"]
    return Stage(seed, m.name, f"method {m.name!r} ({m.ensemble['by']} of {', '.join(m.ensemble['of'])})",
                 os.path.join(seed_dir, m.name), args, PRETRAINED, upstream, method=m.name,
                 members=tuple(name for _, name, _ in members), combine=m.ensemble["by"])


def stage_key(stage: Stage) -> str:
    return f"seed{stage.seed}/{stage.name}"


def upstream_args(stage: Stage, done: dict[str, dict[int, dict]], evaluated: Optional[str] = None) -> list[str]:
    """The paths of upstream outputs; `evaluated`: the stage an evaluating stage reads (`evaluated_stage`)."""
    args = []
    if "teacher" in stage.upstream:
        args.append(f"--data.teacher_checkpoint={done['teacher'][stage.seed]['checkpoint']}")
    if stage.extra_teachers:  # their labels beside the main teacher's, which stays the reference of the scores
        args.append("--data.extra_teacher_checkpoints=" + json.dumps([done[n][stage.seed]["checkpoint"]
                                                                      for n in stage.extra_teachers]))
    if "ceiling" in stage.upstream:
        args.append(f"--model.ceiling_results={ceiling_results_path(stage)}")
    if evaluated:
        args += [*stage.source_args[evaluated], f"--ckpt_path={read_checkpoint(stage, done[evaluated][stage.seed])}"]
    if stage.combine == "predictions":
        args.append("--model.init_args.members=" + json.dumps([done[n][stage.seed]["checkpoint"]
                                                               for n in stage.members]))
    elif stage.combine == "weights":
        args.append(f"--ckpt_path={averaged_checkpoint(stage)}")
    return args


def read_checkpoint(stage: Stage, source: dict) -> str:
    """The checkpoint an evaluating stage reads from its source's result: the kept one, or a trajectory reader's
    final weights (`last`, which the source keeps for it since its readers were declared)."""
    if stage.reads is None:
        return source["checkpoint"]
    where = os.path.join(os.path.dirname(stage.dir), stage.reads)
    if "last" not in source:
        raise ValueError(f"stage {stage.dir} ({stage.role}) reads the final weights of {where}, which finished before "
                         f"early-stopping fits kept them: rerun it with --force seed{stage.seed}/{stage.reads}")
    if source["last"]["drew"]:
        raise ValueError(f"stage {stage.dir} ({stage.role}) reads the fit of {where}, whose trajectory depends on how "
                         f"often it validates ({'; '.join(source['last']['drew'])}): drop the method's trajectory (it "
                         "then fits its own)")
    return source["last"]["checkpoint"]


def averaged_checkpoint(stage: Stage) -> str:
    return os.path.join(stage.dir, "averaged.ckpt")


def evaluated_stage(stage: Stage, done: dict[str, dict[int, dict]]) -> str:
    """The stage whose checkpoint an evaluating stage reads: its source method's, or a swept source's `id_val` pick
    in this seed (the same rule, and tie-break, as the source's own row)."""
    from protocols.w2s.model_selection import pick, rule_score

    names = list(stage.source_args)
    if len(names) == 1:
        return names[0]
    return names[pick([rule_score(done[n][stage.seed], "id_val", [], f"{os.path.dirname(stage.dir)}/{n}")
                       for n in names])]


def ceiling_results_path(stage: Stage) -> str:
    return os.path.join(os.path.dirname(stage.dir), "ceiling", "ceiling_test.json")


def stage_changes(stage: Stage, finished: Optional[dict], identity: dict) -> list[str]:
    """`identity_changes`, where a teacher search's options added to the code since the stage ran are no change
    when its recorded candidates show they did not come into play (`teacher_search.replays_the_same`)."""
    from protocols.w2s.teacher_search import replays_the_same

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


def identity_of(stage: Stage, upstream: dict) -> dict:
    """`stage_identity`, plus the state of an outside model's files (its path alone, in the config, would not notice
    a new export written to the same directory) and the contents behind its data options (`data_identity`)."""
    from datamodules.preference.weak_labels import checkpoint_key

    model = checkpoint_key(stage.pretrained, "--teacher_pretrained / --zero_shot") if stage.pretrained else None
    if stage.data is None:  # hashed once per stage and run (file hashes are cached across runs too)
        stage.data = data_identity(without_location(stage.config))
    identity = stage_identity(stage.config, stage.checkpoint, upstream, model=model, data=stage.data,
                              search=asdict(stage.search) if stage.search else None)
    if stage.keep_every:  # its result holds every validation's test results too (absent otherwise: old identities)
        identity["keep_every"] = True
    if stage.reads:  # the fit it is (its upstream too): named, so a reader never reads as the fit it replaced
        identity["trajectory"] = stage.reads
    return identity


def clear_stage_dir(stage_dir: str) -> None:
    """Remove an unfinished or replaced stage's old outputs (logs, checkpoints) before it runs again.

    `result.json` goes first: if the removal is interrupted, the stage reads as unfinished, never as finished.
    """
    result = os.path.join(stage_dir, "result.json")
    if os.path.exists(result):
        os.remove(result)
    if os.path.isdir(stage_dir):
        shutil.rmtree(stage_dir)
