"""Preference objectives: a small open registry chosen by config (`--model.objective naive`, or a class path).

Each objective maps the pair margins Δ (B,) and the label q = P(a ≻ b) (B,) to a scalar loss. ANCHOR is not an
objective of its own: it adds λ·L_anchor to any of these (see `RewardModelModule.anchor_coef`).
SEAM is named by the paper but its definition is not available to us; it is deliberately absent -- register it
here (`@register_objective`) once its definition is known.
"""
from __future__ import annotations

import math
from typing import Literal

import torch

from lightning_modules.reward.losses import (
    bradley_terry_loss, confidence_w2s_loss, soft_bradley_terry_loss, soften_labels,
)

OBJECTIVES: dict[str, type["PreferenceObjective"]] = {}


def register_objective(name: str):
    def wrap(cls):
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} registered twice")
        OBJECTIVES[name] = cls
        cls.registry_name = name
        return cls

    return wrap


def resolve_objective_class(name: str) -> type["PreferenceObjective"]:
    """An objective class from its registry name ("naive"), class name ("SoftBradleyTerry") or dotted path.

    Raises ValueError naming the valid choices.
    """
    if name in OBJECTIVES:
        return OBJECTIVES[name]
    by_class = {cls.__name__: cls for cls in OBJECTIVES.values()}
    leaf = name.rsplit(".", 1)[-1]
    if leaf in by_class and (name == leaf or name == f"{__name__}.{leaf}"):
        return by_class[leaf]
    if "." in name:  # a user's own objective elsewhere
        import importlib

        module, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"objective {name!r} cannot be imported: {e}") from None
        if isinstance(cls, type) and issubclass(cls, PreferenceObjective):
            return cls
        raise ValueError(f"objective {name!r} is not a PreferenceObjective subclass")
    raise ValueError(f"unknown objective {name!r}; registered: {sorted(OBJECTIVES)} "
                     f"(classes {sorted(by_class)}), or a dotted path to a PreferenceObjective subclass")


def objective_class_path(name: str) -> str:
    """The dotted class path of an objective named as `resolve_objective_class` accepts (what configs record)."""
    cls = resolve_objective_class(name)
    return f"{cls.__module__}.{cls.__qualname__}"


class PreferenceObjective:
    """Base class. `progress` is the fraction of training done, in [0, 1]."""

    registry_name = "base"
    uses_soft_labels = True

    def __call__(self, margin: torch.Tensor, q: torch.Tensor, progress: float) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


@register_objective("gold")
class GoldBradleyTerry(PreferenceObjective):
    """Gold labels, a = chosen: −log σ(Δ). For the teacher and the ceiling."""

    uses_soft_labels = False

    def __call__(self, margin, q, progress):
        if not bool((q == 1).all()):
            raise ValueError("GoldBradleyTerry expects gold pairs (a = chosen, q = 1); use SoftBradleyTerry for soft labels")
        return bradley_terry_loss(margin)


def check_label_options(label_temperature: float, label_smoothing: float) -> None:
    if not (isinstance(label_temperature, (int, float)) and math.isfinite(label_temperature)
            and label_temperature > 0):
        raise ValueError(f"--model.objective.init_args.label_temperature must be > 0 (and finite), "
                         f"got {label_temperature!r}")
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"--model.objective.init_args.label_smoothing must be in [0, 1], got {label_smoothing!r}")


@register_objective("naive")
class SoftBradleyTerry(PreferenceObjective):
    """Naive W2S: BCE-with-logits(Δ, q'') on the teacher's soft labels q, tempered and smoothed first.

    Args:
        label_temperature: T of q' = σ(logit(q) / T): T > 1 softens the teacher's labels towards 1/2, T < 1
            sharpens them; labels of exactly 0 or 1 stay put (`losses.soften_labels`). 1.0 leaves q as is.
        label_smoothing: ε of q'' = (1 − ε)·q' + ε/2, in [0, 1]. 0.0 leaves q' as is.
    """

    def __init__(self, label_temperature: float = 1.0, label_smoothing: float = 0.0):
        check_label_options(label_temperature, label_smoothing)
        self.label_temperature, self.label_smoothing = float(label_temperature), float(label_smoothing)

    def __call__(self, margin, q, progress):
        return soft_bradley_terry_loss(margin, soften_labels(q, self.label_temperature, self.label_smoothing))


@register_objective("confidence")
class ConfidenceW2S(PreferenceObjective):
    """Burns et al. (2023) auxiliary confidence loss, adapted to pairs (docs/w2s.md).

    Args:
        aux_coef: final weight c of the student's own hardened labels in the target.
        warmup_fraction: fraction of training over which c ramps from 0 to aux_coef.
        ramp: shape of the ramp: "linear", "cosine" (smooth start and end) or "step" (0 then aux_coef).
        hardening: how the student's predictions become 0/1 labels: "top" (SPEC: the top round(mean(q)·B) of
            the batch by σ(Δ)) or "quantile" (openai/weak-to-strong: 1 − σ(Δ) strictly below its mean(q)
            quantile); they differ by one label on some batch sizes, on ties and on a batch of one
            (`losses.hardened_student_labels`, docs/w2s.md).
        label_temperature: T of the teacher labels' tempering q' = σ(logit(q) / T) (as `SoftBradleyTerry`); the
            tempered, smoothed q'' then stands for q everywhere: in the target and in the hardening's class balance.
        label_smoothing: ε of q'' = (1 − ε)·q' + ε/2.
    """

    def __init__(self, aux_coef: float = 0.5, warmup_fraction: float = 0.1,
                 ramp: Literal["linear", "cosine", "step"] = "linear",
                 hardening: Literal["top", "quantile"] = "top",
                 label_temperature: float = 1.0, label_smoothing: float = 0.0):
        if not 0.0 <= aux_coef <= 1.0:
            raise ValueError(f"--model.objective.init_args.aux_coef must be in [0, 1], got {aux_coef}")
        if not 0.0 <= warmup_fraction <= 1.0:
            raise ValueError(f"--model.objective.init_args.warmup_fraction must be in [0, 1], got {warmup_fraction}")
        if ramp not in ("linear", "cosine", "step"):
            raise ValueError(f"--model.objective.init_args.ramp must be linear, cosine or step, got {ramp!r}")
        if hardening not in ("top", "quantile"):
            raise ValueError(f"--model.objective.init_args.hardening must be top or quantile, got {hardening!r}")
        self.aux_coef, self.warmup_fraction, self.ramp = aux_coef, warmup_fraction, ramp
        self.hardening = hardening
        check_label_options(label_temperature, label_smoothing)
        self.label_temperature, self.label_smoothing = float(label_temperature), float(label_smoothing)

    def coef(self, progress: float) -> float:
        if self.warmup_fraction == 0 or progress >= self.warmup_fraction:
            return self.aux_coef
        t = max(progress, 0.0) / self.warmup_fraction
        if self.ramp == "step":
            return 0.0
        if self.ramp == "cosine":
            return self.aux_coef * 0.5 * (1.0 - math.cos(math.pi * t))
        return self.aux_coef * t

    def __call__(self, margin, q, progress):
        q = soften_labels(q, self.label_temperature, self.label_smoothing)
        return confidence_w2s_loss(margin, q, self.coef(progress), self.hardening)
