"""Preference objectives: a small open registry chosen by config (`--model.objective naive`, or a class path).

Each objective maps the pair margins Δ (B,) and the label q = P(a ≻ b) (B,) to a scalar loss; one with
`uses_teacher_labels` takes every teacher's labels (B, K+1) instead (`MultiTeacherSoftBT`). ANCHOR is not an
objective of its own: it adds λ·L_anchor to any of these (see `RewardModelModule.anchor_coef`).
SEAM is named by the paper but its definition is not available to us; it is deliberately absent -- register it
here (`@register_objective`) once its definition is known.
"""
from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from torch import nn

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
    uses_teacher_labels = False  # True: called with the batch's `teacher_labels` (B, K+1) instead of `labels` (B,)

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


@register_objective("multi_teacher")
class MultiTeacherSoftBT(nn.Module, PreferenceObjective):
    """Soft Bradley–Terry on a learned mixture of K+1 teachers' labels (after RAVEN, NeurIPS 2025;
    docs/multi_teacher.md).

    L = BCE-with-logits(Δ_i, q̄_i), q̄_i = Σ_k w_k q_ik, w = softmax(logits) on the simplex, minimised jointly over the
    student θ and the logits (they are parameters of this module, so of the reward model: in its optimizer and its
    checkpoints). Column 0 of q is the main teacher (`--data.teacher_checkpoint`), then
    `--data.extra_teacher_checkpoints` in order. The logits start at 0: the uniform mixture.

    What the joint minimisation does: BCE(Δ, q̄) = softplus(Δ) − q̄·Δ is *linear* in q̄, so ∂L/∂logit_k =
    −w_k · mean_i[Δ_i (q_ik − q̄_i)]: weight moves towards the teachers whose labels lie on the side of the student's
    current margins -- the teachers the student can fit (or already agrees with). That is RAVEN's mechanism (a
    teacher that contradicts what the student learns loses weight), and its risk: nothing in the objective says which
    teacher is right, the minimum over the simplex is a vertex, and a student that picked up a shortcut moves the
    weight to the teacher that shares it (confirmation). How far the weights go is set by `weights_lr` and the run's
    length, not by a convergence.

    No per-sample weights: with the loss linear in q̄, a per-pair choice of teacher minimises to q̄_i = the label
    closest to the student's own prediction on every pair, i.e. the student trains on its own opinion wherever any
    teacher shares it -- no weak supervision left.

    Args:
        num_teachers: K + 1, the width of the batches' `teacher_labels` (1 + the number of
            `--data.extra_teacher_checkpoints`); at least 2.
        weights_lr: learning rate of the logits (their own optimizer group, without weight decay, which would pull
            them back to uniform); null: the model's. Adam moves a parameter by about lr per step whatever its
            gradient's scale, so at the student's 2e-4 the logits move by < 0.05 in a few hundred steps and the
            mixture stays uniform; 0.02 lets two logits part by up to ~4 in 100 steps (a weight ratio of up to e^4).
    """

    uses_teacher_labels = True

    def __init__(self, num_teachers: int = 2, weights_lr: Optional[float] = 0.02):
        nn.Module.__init__(self)
        if isinstance(num_teachers, bool) or not isinstance(num_teachers, int) or num_teachers < 2:
            raise ValueError(f"--model.objective.init_args.num_teachers must be an integer >= 2 (the main teacher "
                             f"and at least one of --data.extra_teacher_checkpoints), got {num_teachers!r}")
        if weights_lr is not None and not (isinstance(weights_lr, (int, float)) and math.isfinite(weights_lr)
                                           and weights_lr > 0):
            raise ValueError(f"--model.objective.init_args.weights_lr must be > 0 (or null: the model's), got "
                             f"{weights_lr!r}")
        self.num_teachers = num_teachers
        self.weights_lr = None if weights_lr is None else float(weights_lr)
        self.logits = nn.Parameter(torch.zeros(num_teachers))  # (K+1,): uniform at the start

    def weights(self) -> torch.Tensor:
        """w = softmax(logits), (K+1,), on the simplex."""
        return torch.softmax(self.logits.float(), dim=0)

    def mixture(self, teacher_labels: torch.Tensor) -> torch.Tensor:
        """q̄ = Σ_k w_k q_k, (B,), from every teacher's labels (B, K+1)."""
        if teacher_labels.dim() != 2 or teacher_labels.shape[1] != self.num_teachers:
            raise ValueError(f"--model.objective.init_args.num_teachers is {self.num_teachers}, but the batch holds "
                             f"{tuple(teacher_labels.shape)} teacher labels: it must be 1 + the number of "
                             "--data.extra_teacher_checkpoints")
        return teacher_labels.float() @ self.weights()  # (B,)

    def forward(self, margin: torch.Tensor, teacher_labels: torch.Tensor, progress: float) -> torch.Tensor:
        return soft_bradley_terry_loss(margin, self.mixture(teacher_labels))

    def extra_repr(self) -> str:
        return f"num_teachers={self.num_teachers}, weights_lr={self.weights_lr}"
