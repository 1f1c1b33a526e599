"""The regulariser plug-in interface of `RewardModelModule` (docs/robust_baselines.md, "Regularisers as plug-ins").

A regulariser adds one term to the training loss. It declares what it needs -- every layer's hidden states, the
causal LM's head, a frozen reference model, the pretrained weights θ₀ -- and the module builds each of those once
for all of them; every training step hands it the step's outputs (`StepOutputs`) and adds the term it returns. A new
one is a subclass in a file of its own plus a config entry, nothing else:

    --model.regularisers='[{"class_path": "my_package.my_term.MyTerm", "init_args": {"coef": 0.1}}]'
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch


@dataclass
class StepOutputs:
    """What a training step's forward produced, for the regularisers. Rows of the forward: [0, B) are the a sides of
    the B pairs, [B, 2B) the b sides."""

    batch: dict
    rewards_a: torch.Tensor  # (B,)
    rewards_b: torch.Tensor  # (B,)
    hidden: Optional[tuple]  # (embeddings, layer 1, ..., layer L), each (2B, T, H), when a regulariser needs them
    prefix: Optional[tuple]  # (family, k, h_k) of a shared frozen prefix (the reference reuses it), else None
    module: Any  # the RewardModelModule: its backbone, lm_head, frozen_reference, pretrained_weights


class Regulariser:
    """Base class: a term `coef · L` added to the preference loss (`term` returns it scaled, and what to log).

    Class attributes say what the module must build for it:
        needs_hidden_states: the training forward returns every layer's hidden states (a full, padded forward).
        needs_lm_head: the backbone is built with its causal LM head (`module.lm_head`).
        needs_pretrained_weights: θ₀ of the trainable backbone parameters is kept (`module.pretrained_weights`,
            names in `module.finetuned_names`).
    and these may depend on the init args:
        preference_weight: the preference loss is multiplied by it before the terms are added (GRM's 1 − α).
        needs_reference: `callbacks.reference_model.ReferenceModelCallback` builds a frozen copy of the backbone
            (`module.frozen_reference`), with the LM head too when `reference_needs_head`.
    Every init arg is kept as an attribute of the same name: `spec` writes them back (checkpoints, config.yaml).
    """

    needs_hidden_states = False
    needs_lm_head = False
    needs_pretrained_weights = False
    preference_weight = 1.0
    needs_reference = False
    reference_needs_head = False
    coef: float = 0.0

    def check(self, model_args: Mapping[str, Any]) -> None:
        """Refuse, naming the flag, a model this term cannot train (called from the module's init args alone). By
        default an outside `hf_classifier:` reward model, which only evaluates."""
        from lightning_modules.export.hf_classifier import is_hf_classifier

        if is_hf_classifier(model_args["backbone"]):
            raise ValueError(f"--model.regularisers {type(self).__name__}: --model.backbone {model_args['backbone']!r} "
                             "is an outside reward model scored whole: it only evaluates. Drop the regulariser")

    def attach(self, module: Any, model_args: Mapping[str, Any]) -> None:
        """Called once the backbone is built (frozen layers, adapters and LM head in place), before θ₀ is taken;
        `model_args`: the module's init args, as `check` got them."""

    def keeps_reward_offset(self) -> bool:
        """True when the term reads the rewards' level or the last hidden states themselves (not only reward
        differences): the final LayerNorm's bias then keeps training (`reward_model._freeze_reward_offset`)."""
        return False

    def on_fit_start(self, module: Any) -> None:
        """Called at the start of every fit, after the module has moved to its device."""

    def term(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The term added to the loss (already scaled by `coef`), and what to log (`train/<name>` keys)."""
        raise NotImplementedError

    def spec(self) -> dict:
        """{"class_path", "init_args"}: what a config file or a checkpoint's hyperparameters hold for it."""
        cls = type(self)
        names = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": {n: getattr(self, n) for n in names}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.spec()['init_args'].items())})"


def build_regulariser(spec: Any) -> Regulariser:
    """A `Regulariser` as given, or built from its {"class_path", "init_args"} dict (a checkpoint's hyperparameters
    hold that form: `load_from_checkpoint` and `cli.py test --ckpt_path` rebuild the module from it)."""
    if isinstance(spec, Regulariser):
        return spec
    path = spec.get("class_path") if isinstance(spec, Mapping) else None
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"--model.regularisers: {spec!r} is neither a Regulariser nor a dict with a dotted "
                         "class_path (and init_args)")
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--model.regularisers: {path!r} cannot be imported: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, Regulariser)):
        raise ValueError(f"--model.regularisers: {path!r} is not a Regulariser subclass")
    return cls(**dict(spec.get("init_args") or {}))


def check_coef(coef: float, flag: str) -> float:
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not coef >= 0:  # `not >=` refuses NaN
        raise ValueError(f"{flag} must be >= 0, got {coef}")
    return float(coef)


def row_keys(batch: dict) -> list:
    """One key per row, the same for a sequence in every epoch: rows are (a_1..a_B, b_1..b_B), and a pair's order
    is fixed across epochs although batches are regrouped (the reference's per-fit caches are keyed by them)."""
    index = batch["index"].tolist()
    return [("a", i) for i in index] + [("b", i) for i in index]
