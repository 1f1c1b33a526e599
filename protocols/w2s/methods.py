"""A W2S protocol's student methods (`Method`): an objective, optionally anchored, swept, evaluated from another
method's checkpoints, read from another method's trajectory, or combined; each checked when built (docs/w2s.md)."""
from __future__ import annotations

import json
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Optional

from lightning_modules.reward.objectives import objective_class_path, resolve_objective_class
from protocols.w2s.teacher_search import value_label


def _default(cls, name: str) -> Any:
    f = next(f for f in fields(cls) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default


def _defaults(cls) -> dict[str, Any]:
    """The declared defaults of a dataclass's fields (those that have one)."""
    return {f.name: _default(cls, f.name) for f in fields(cls)
            if f.default is not MISSING or f.default_factory is not MISSING}



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
            rule (`protocols.w2s.model_selection`: `id_val`, and `oracle_target` reported beside it as an upper bound).
        from_method: evaluate an earlier method's checkpoints instead of fitting: `cli.py validate` + `cli.py test`
            with this method's arguments (WiSE-FT: `--model.wise_ft_alpha`). Costs evaluations only. A swept source
            gives, per seed, its `id_val` pick (WiSE-FT of the selected ANCHOR student); the result names the stage
            it evaluated (`evaluated`).
        checkpoint: "best" or "last", overriding the protocol's `student_checkpoint` for this method: "best" with
            frequent validation is early stopping on the ID validation split (and, for the `weak_val` rule, on the
            teacher's labels of that split: the run also keeps that checkpoint and tests it).
        test_every_validation: also test the checkpoint of every validation (`by_step` in the result): the
            same-step comparison between methods. One test per validation.
        ensemble: an evaluation-only row over students of the same seed that share a start,
            {"of": [earlier fitted methods], "by": "weights" | "predictions"}: every stage of each named method (all
            of a sweep's values: no selection, so the row is the same under every rule) combined by weight averaging
            (WARM; `lightning_modules.reward.weight_averaging`) or by the mean of their rewards (a prediction
            ensemble; `lightning_modules.reward.ensemble`). Costs a validate + test. Nothing else may be set.
        fixed: a row with no stage of its own, {"method": <an earlier swept method>, "value": <one of its values>}:
            that method's stage at a value fixed in advance, in every seed, under every rule (no selection; the
            budget table counts its one fit). Nothing else may be set on such a row.
        teacher: train on the labels of another teacher of the same seed: the name of one of the protocol's
            `extra_teachers` ("teacher", the main one, is the default). The WRG / AOG / NTS stay against the main
            teacher (docs/multi_teacher.md). `sweep: {teacher: [teacher, <extra teacher>, ...]}` gives one stage per
            teacher and the row of the best single teacher, picked per seed by the selection rule.
            A multi-teacher objective (`multi_teacher`) reads every extra teacher instead.
        trajectory: fit nothing: the row is the final weights (`checkpoint: last`) of another method's fit that keeps
            its `best` (`{name: naive, trajectory: early_stop, checkpoint: last}`): validation does not change a
            fit's trajectory (docs/w2s.md, one fit per trajectory). A validate + test; a swept source is read value
            by value, its sweep taken. Nothing but `checkpoint` (and that sweep) may be set beside it.
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
    test_every_validation: bool = False
    ensemble: Optional[dict] = None
    fixed: Optional[dict] = None
    teacher: Optional[str] = None
    trajectory: Optional[str] = None

    def __post_init__(self) -> None:
        if self.trajectory is not None:
            own = [k for k in self._set_besides("trajectory") if k not in ("checkpoint", "sweep")]
            if own:
                raise ValueError(f"method {self.name!r} reads {self.trajectory!r}'s fit (trajectory), whose options "
                                 f"make it: drop its own {own}")
        if self.ensemble is not None:
            if set(self.ensemble) != {"of", "by"} or self.ensemble["by"] not in ("weights", "predictions") \
                    or not isinstance(self.ensemble["of"], list) or not self.ensemble["of"]:
                raise ValueError(f"method {self.name!r}: ensemble takes {{of: [earlier fitted methods], by: weights | "
                                 f"predictions}}, got {self.ensemble}")
            own = self._set_besides("ensemble")
            if own:
                raise ValueError(f"method {self.name!r} combines other methods' students: drop its {own}")
        if self.fixed is not None:
            if set(self.fixed) != {"method", "value"}:
                raise ValueError(f"method {self.name!r}: fixed takes {{method: <a swept method>, value: <one of its "
                                 f"values>}}, got {self.fixed}")
            own = self._set_besides("fixed")
            if own:
                raise ValueError(f"method {self.name!r} reads {self.fixed['method']!r}'s stage at a fixed value: it "
                                 f"has no stage of its own, so drop its {own}")
        if len(self.sweep) > 1:
            raise ValueError(f"method {self.name!r}: sweep takes one flag (one hyperparameter per row), got "
                             f"{sorted(self.sweep)}")
        for flag, values in self.sweep.items():
            if flag != SWEEP_TEACHER and not re.fullmatch(r"--(model|data|trainer)\.[A-Za-z0-9_.]+", flag):
                raise ValueError(f"method {self.name!r}: sweep key {flag!r} is not a cli.py flag like "
                                 f"'--model.anchor_coef' (or {SWEEP_TEACHER!r}: the teachers whose labels it trains "
                                 "on)")
            if not isinstance(values, list) or not values:
                raise ValueError(f"method {self.name!r}: sweep {flag} needs a non-empty list of values")
            labels = [value_label(v) for v in values]
            if len(set(labels)) != len(labels):
                raise ValueError(f"method {self.name!r}: sweep {flag} repeats a value: {values}")
        if self.checkpoint not in (None, "best", "last"):
            raise ValueError(f"method {self.name!r}: checkpoint must be 'best' or 'last', got {self.checkpoint!r}")
        if self.teacher is not None and (self.from_method or self.sweep_flag == SWEEP_TEACHER):
            raise ValueError(f"method {self.name!r}: teacher {self.teacher!r} "
                             + ("with from_method: an evaluating method trains on no labels" if self.from_method
                                else "and a sweep over teachers: give one of them"))

    def _set_besides(self, option: str) -> list[str]:
        """The options other than `name` and `option` that differ from their defaults (a row that only combines or
        reads other methods' stages takes none)."""
        return [f.name for f in fields(self) if f.name not in ("name", option)
                and getattr(self, f.name) != _default(Method, f.name)]

    @property
    def sweep_flag(self) -> Optional[str]:
        return next(iter(self.sweep), None)

    def variants(self) -> list[tuple[str, Any, list[str]]]:
        """(stage name, swept value, extra arguments) per stage of the method; one (name, None, []) unswept. A sweep
        over teachers has no arguments of its own: the teacher's checkpoint is an upstream output (`label_teacher`)."""
        if not self.sweep:
            return [(self.name, None, [])]
        flag = self.sweep_flag
        short = flag.rsplit(".", 1)[-1]
        return [(f"{self.name}@{short}={value_label(v)}", v,
                 [] if flag == SWEEP_TEACHER else [f"{flag}={json.dumps(v)}"]) for v in self.sweep[flag]]

    def variants_of(self, source: "Method") -> Optional[dict[str, str]]:
        """A trajectory reader's stage -> the source's stage it reads, value by value; None when the sweeps differ."""
        if self.sweep_flag != source.sweep_flag or [value_label(v) for v in self.sweep.get(self.sweep_flag, [])] != [
                value_label(v) for v in source.sweep.get(source.sweep_flag, [])]:
            return None
        return {mine[0]: theirs[0] for mine, theirs in zip(self.variants(), source.variants())}

    def label_teacher(self, value: Any = None) -> Optional[str]:
        """The teacher whose labels one stage of the method trains on (`value`: its swept value); None: the main."""
        name = value if self.sweep_flag == SWEEP_TEACHER else self.teacher
        return None if name == MAIN_TEACHER else name

    @property
    def uses_teacher_labels(self) -> bool:
        """Its objective trains on every teacher's labels (a multi-teacher objective)."""
        if self.ensemble is not None or self.fixed is not None:
            return False
        return bool(getattr(resolve_objective_class(self.objective_class_path()), "uses_teacher_labels", False))

    def objective_class_path(self) -> str:
        """The dotted path `--model.objective` takes, whatever form `objective` was given in."""
        try:
            return objective_class_path(self.objective)
        except ValueError as err:
            raise ValueError(f"method {self.name!r}: objective: {err}") from None

    def cli_args(self, num_teachers: Optional[int] = None) -> list[str]:
        """`num_teachers`: the teachers of the protocol (1 + its extra teachers), which a multi-teacher objective
        takes as `num_teachers` unless its `objective_args` say otherwise (the protocol refuses a mismatch)."""
        init_args = dict(self.objective_args)
        if num_teachers is not None and self.uses_teacher_labels:
            init_args.setdefault("num_teachers", num_teachers)
        objective = {"class_path": self.objective_class_path(), "init_args": init_args}
        return [f"--model.objective={json.dumps(objective)}", f"--model.anchor_coef={self.anchor_coef}",
                f"--model.anchor_layers={json.dumps(self.anchor_layers)}", *self.args]


MODEL_OPTIONS = ("objective", "objective_args", "anchor_coef", "anchor_layers")  # what a checkpoint's hparams fix
SWEEP_TEACHER = "teacher"  # the sweep key over teachers (`Method.teacher`'s values)
MAIN_TEACHER = "teacher"  # the main teacher's stage: `Method.teacher`'s default
