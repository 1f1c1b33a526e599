"""The W2S protocol's configuration (`W2SProtocol`: its data, teachers, seeds and methods, `protocols.w2s.methods`),
checked when built, before any stage is planned (docs/w2s.md)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

from lightning_modules.export.hf_classifier import (
    PREFIX as HF_CLASSIFIER, canonical_classifier, check_classifier_source, classifier_init_args, classifier_source,
    is_hf_classifier,
)
from protocols.engine.stage_identity import check_seeds
from protocols.w2s.methods import MAIN_TEACHER, MODEL_OPTIONS, SWEEP_TEACHER, Method, _default
from protocols.w2s.teacher_search import TeacherSearch, value_label


@dataclass
class ExtraTeacher:
    """One more weak teacher per seed, fitted like the main one (docs/multi_teacher.md).

    Args:
        name: its stage folder (`seed<k>/<name>`) and its name in methods' `teacher` option, in a sweep over teachers
            and in the multi-teacher weights; a plain folder name that no method, zero-shot row or other teacher
            takes.
        args: its own `cli.py` arguments, after the main teacher's config files and `teacher_args` (e.g.
            `--model.vocab_limit=10000`). No teacher search: the main teacher's recipe is searched, this one is
            fitted once.
    """

    name: str
    args: list[str] = field(default_factory=list)


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
        teacher_labeller: a labelling function as the teacher, "labeller:<name>[:key=value,...]"
            (`datamodules/preference/labelling_functions.py`: the VADER lexicon, one human rater; vader_icwsm.md):
            not trained; its stage runs `cli.py test` of `LabellerTeacherModule` on the students' data settings (the
            student half, `student_args`' data flags, `teacher_args`, which must give `--model.tokenizer`: the
            students'), so its row is scored on the students' pairs, and the students' weak labels are its margins.
        zero_shot: outside reward models ("hf_classifier:<dir or hub id>") tested as is on every split, with
            WRG / AOG / NTS against the teacher on the same pairs: extra rows `zero_shot_<directory name>`.
        zero_shot_args: extra `cli.py` arguments of the zero-shot stages (data flags that must match the other
            stages', e.g. `--data.max_length`).
        seeds: one teacher, one label set, one ceiling and one student per method, per seed.
        ceiling: train the ceiling (student on gold labels of the student half) and report PGR.
        teacher_args: extra `cli.py` arguments of the teacher stages.
        student_args: extra `cli.py` arguments of the ceiling and student stages.
        teacher_checkpoint: "best" (by gold validation accuracy; the teacher is trained on gold labels) or "last".
        teacher_search: the weak teacher's fitted recipe (`protocols.w2s.teacher_search`, docs/teacher_structure.md):
            the teacher stage fits one teacher per candidate value of a knob and keeps the one whose structure on the
            validation split (read with the response-only shortcut probe) is closest to the target; the choice,
            every candidate's figures and the chosen teacher's structure go to the stage's result.json and the
            table. null: the teacher is fitted once, as `teacher_args` say.
        student_checkpoint: "last" (default: the end of training, no checkpoint chosen) or "best" (the checkpoint
            with the best gold validation accuracy: the id_val rule, which reads the validation split's gold labels;
            docs/w2s.md, selection rules). A method's own `checkpoint` overrides it.
        drift: add the drift-diagnostics callback to student stages and report its final values.
        extra_teachers: more weak teachers per seed, [{name, args}] (`ExtraTeacher`): each fitted on the teacher
            half with gold labels, as the main teacher (its config files, `teacher_args`, then its own `args`; no
            search), in a stage of its own. Methods train on one of them (`Method.teacher`, a sweep over teachers)
            or on all of them (a multi-teacher objective, `multi_teacher`: the main teacher is column 0, then these
            in this order). The main teacher stays the reference of every WRG / AOG / NTS (docs/multi_teacher.md).
        paired_reference: the method every other is compared with, seed by seed (NTS(reference) − NTS(X), mean and
            95% interval); a list: one paired table per reference, the first the headline (`paired` in
            results.json; all in `paired_by_reference`); null: no paired table. A name that is not a method is
            refused, except the default "anchor" when no method is named so (then no paired table).
        results_name: the folder of this configuration's published set, `<out_dir>/<results_name>/`. The default
            "results" is linked as `<out_dir>/results.md|json|csv`, `protocol.json`, `figures`; another name as
            `<out_dir>/<results_name>.md|json|csv`. Two configurations that share an out_dir (and so reuse each
            other's stages) each need their own name: a set belongs to the configuration that made it, and another
            one is refused before any work rather than replacing its rows (docs/reruns.md).
        keep_fit_checkpoints: keep every checkpoint a finished stage's fits wrote. By default only those its result
            names stay (the kept one, the `weak_val` one, each teacher search candidate's); the fits' resume points
            (`last.ckpt`, the kept checkpoint's twin) are deleted once the result is written: they were two thirds
            of a run's disk (9 GB per seed of w2s_budget_matched.yaml). Not part of any identity.
    """

    out_dir: str
    trainer_configs: list[str]
    data_configs: list[str]
    student_configs: list[str]
    methods: list[Method]
    teacher_configs: list[str] = field(default_factory=list)
    teacher_pretrained: Optional[str] = None
    teacher_labeller: Optional[str] = None
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
    extra_teachers: list[ExtraTeacher] = field(default_factory=list)
    keep_fit_checkpoints: bool = False

    def __post_init__(self) -> None:
        names = [m.name for m in self.methods]
        if not names:  # a table of the teacher alone would read as a finished protocol with no student in it
            raise ValueError("--methods is empty: give at least one student method (e.g. {name: naive, objective: "
                             "naive}); the protocol's table compares students with their teacher")
        if len(set(names)) != len(names):
            raise ValueError(f"--methods has duplicate names: {names}")
        reserved = {"teacher", "ceiling"} & set(names)
        if reserved:
            raise ValueError(f"--methods may not be named {sorted(reserved)} (reserved rows)")
        self._check_trajectories()
        self._check_outside_models(names)
        self.extra_teachers = [e if isinstance(e, ExtraTeacher) else ExtraTeacher(**e) for e in self.extra_teachers]
        self._check_extra_teachers(names)
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", n)]
        if bad:  # a method's name is its stage folder, which a forced rerun deletes: never a path
            raise ValueError(f"--methods names must be plain folder names (letters, digits, _ . -), got {bad}")
        for i, method in enumerate(self.methods):
            if method.fixed is not None:
                self._check_fixed(method, {m.name: m for m in self.methods[:i]})
                continue
            if method.ensemble is not None:
                earlier = {m.name: m for m in self.methods[:i]}
                bad = [n for n in method.ensemble["of"] if n not in earlier or earlier[n].from_method
                       or earlier[n].fixed is not None or earlier[n].ensemble is not None]
                members = sum(len(earlier[n].variants()) for n in method.ensemble["of"] if n not in bad)
                if bad or len(set(method.ensemble["of"])) != len(method.ensemble["of"]) or members < 2:
                    raise ValueError(f"method {method.name!r}: ensemble.of {method.ensemble['of']} must name distinct "
                                     f"earlier methods that fit their students ({bad or 'repeated'}), 2 stages or "
                                     "more in all")
                continue
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
        check_seeds(self.seeds)  # non-negative, distinct: before any folder is made
        self._check_paired_reference(names)
        self._check_results_name(names)
        if self.teacher_pretrained and self.teacher_configs:
            raise ValueError("give either --teacher_configs (a teacher trained here) or --teacher_pretrained (an "
                             f"outside model tested as is), not both: got {self.teacher_configs} and "
                             f"{self.teacher_pretrained!r}")
        if self.teacher_search is not None and self.teacher_pretrained:
            raise ValueError("--teacher_search fits the teacher, --teacher_pretrained tests an outside one as is: "
                             "give one of them")
        self._check_labeller()
        if not self.teacher_pretrained and not self.teacher_labeller and not self.teacher_configs:
            raise ValueError("--teacher_configs is empty: give the teacher's model config files, or an outside "
                             "teacher as --teacher_pretrained hf_classifier:<dir or hub id>")
        for path in [*self.trainer_configs, *self.data_configs, *self.teacher_configs, *self.student_configs]:
            if not os.path.isfile(path):
                raise ValueError(f"config file {path!r} does not exist")

    def _check_labeller(self) -> None:
        """A labelling-function teacher: a known labeller, and the only teacher (nothing to fit, no other model)."""
        if self.teacher_labeller is None:
            return
        from datamodules.preference.labelling_functions import build_labeller, is_labeller

        if not is_labeller(self.teacher_labeller):
            raise ValueError(f"--teacher_labeller {self.teacher_labeller!r}: give 'labeller:<name>' "
                             "(docs/vader_icwsm.md)")
        build_labeller(self.teacher_labeller, "--teacher_labeller")
        others = [k for k in ("teacher_configs", "teacher_pretrained", "teacher_search", "extra_teachers")
                  if getattr(self, k)]
        if others:
            raise ValueError(f"--teacher_labeller is the teacher, a labelling function fitted on nothing: drop "
                             f"{', '.join('--' + k for k in others)}")
        if not any(a.startswith("--model.tokenizer") for a in self.teacher_args):
            raise ValueError("--teacher_labeller: give the students' tokenizer in teacher_args "
                             "('--model.tokenizer=<the student's>'): the teacher row's pairs are then the students'")

    def _check_trajectories(self) -> None:
        """A method that reads another's fit (`Method.trajectory`): its source fits its own students, keeps its best
        checkpoint where the reader keeps the last, and sweeps what the reader sweeps (a reader that gives no sweep
        takes the source's)."""
        by_name = {m.name: m for m in self.methods}
        fitting = [m.name for m in self.methods if not (m.from_method or m.ensemble is not None
                                                         or m.fixed is not None or m.trajectory)]
        for m in self.methods:
            if m.trajectory is None:
                continue
            source = by_name.get(m.trajectory)
            if m.trajectory not in fitting:
                raise ValueError(f"method {m.name!r}: trajectory {m.trajectory!r} must name a method that fits its own "
                                 f"students (not one that evaluates, combines, fixes or reads others'): one of "
                                 f"{fitting}")
            kept = (m.checkpoint or self.student_checkpoint, source.checkpoint or self.student_checkpoint)
            if kept != ("last", "best"):
                raise ValueError(f"method {m.name!r} keeps the last checkpoint of {source.name!r}'s fit, which must "
                                 f"keep its best (early stopping): got checkpoint {kept[0]!r} for {m.name!r} and "
                                 f"{kept[1]!r} for {source.name!r}")
            if not m.sweep:
                m.sweep = {flag: list(values) for flag, values in source.sweep.items()}
            elif m.variants_of(source) is None:
                raise ValueError(f"method {m.name!r}: its sweep {m.sweep} must be {source.name!r}'s {source.sweep}, "
                                 "value by value (or left out: it takes the source's)")

    @staticmethod
    def _check_fixed(method: Method, earlier: dict[str, Method]) -> None:
        source = earlier.get(method.fixed["method"])
        if source is None or not source.sweep:
            raise ValueError(f"method {method.name!r}: fixed.method {method.fixed['method']!r} must name an earlier "
                             f"method with a sweep; the earlier swept methods are "
                             f"{[n for n, m in earlier.items() if m.sweep]}")
        labels = [value_label(v) for v in source.sweep[source.sweep_flag]]
        if value_label(method.fixed["value"]) not in labels:
            raise ValueError(f"method {method.name!r}: fixed.value {method.fixed['value']!r} is not among "
                             f"{source.name!r}'s {source.sweep_flag} values {source.sweep[source.sweep_flag]}")

    def stage_methods(self) -> list[Method]:
        """The methods that have stages of their own (all but the `fixed` rows)."""
        return [m for m in self.methods if m.fixed is None]

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

    def _check_extra_teachers(self, method_names: list[str]) -> None:
        """Extra teachers' names (plain, distinct, no method's or row's), and what the methods ask of them: a
        `teacher` or a sweep over teachers names known teachers, a multi-teacher objective has some to read."""
        extra = [e.name for e in self.extra_teachers]
        bad = [n for n in extra if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", n)]
        if bad:
            raise ValueError(f"--extra_teachers names must be plain folder names (letters, digits, _ . -), got {bad}")
        taken = {"teacher", "ceiling", *method_names, *(zero_shot_name(m) for m in self.zero_shot)}
        clash = sorted({n for n in extra if extra.count(n) > 1 or n in taken})
        if clash:
            raise ValueError(f"--extra_teachers: the names {clash} repeat or are taken (by 'teacher', 'ceiling', a "
                             "method or a zero-shot row); give each teacher a name of its own")
        if extra and not self.teacher_configs:
            raise ValueError("--extra_teachers are fitted like the main teacher, from --teacher_configs, which is "
                             "empty (an outside --teacher_pretrained): give the teachers' model config files")
        known = [MAIN_TEACHER, *extra]
        for m in self.methods:
            if m.ensemble is not None or m.fixed is not None:
                continue
            asked = m.sweep[SWEEP_TEACHER] if m.sweep_flag == SWEEP_TEACHER else [m.teacher] if m.teacher else []
            unknown = [t for t in asked if t not in known]
            if unknown:
                raise ValueError(f"method {m.name!r}: teacher(s) {unknown} are not among the teachers {known} "
                                 "('teacher' and the names of --extra_teachers)")
            if m.from_method is not None or m.trajectory is not None:
                continue
            if m.uses_teacher_labels:
                if asked:
                    raise ValueError(f"method {m.name!r}: a multi-teacher objective reads every teacher: drop its "
                                     "teacher option / sweep over teachers")
                if not extra:
                    raise ValueError(f"method {m.name!r}: objective {m.objective!r} mixes several teachers' labels, "
                                     "but --extra_teachers is empty: add the teachers it mixes")
                given = m.objective_args.get("num_teachers", 1 + len(extra))
                if given != 1 + len(extra):
                    raise ValueError(f"method {m.name!r}: objective_args.num_teachers {given!r} must be 1 + the "
                                     f"{len(extra)} --extra_teachers (or left out: it is set so)")

    def _check_results_name(self, method_names: list[str]) -> None:
        name = self.results_name
        taken = {"logs", "figures", *method_names, *(e.name for e in self.extra_teachers)} | {
            f"seed{s}" for s in self.seeds}
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
