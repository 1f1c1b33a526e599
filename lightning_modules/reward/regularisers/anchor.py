"""ANCHOR: λ · the masked MSE between the student's hidden states and a frozen reference's (the initial student, held
by `callbacks.reference_model.ReferenceModelCallback`), on response tokens only (docs/w2s.md)."""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from lightning_modules.reward.backbones import num_layers
from lightning_modules.reward.losses import selected_mse
from lightning_modules.reward.regularisers.base import Regulariser, StepOutputs, check_coef, row_keys


class Anchor(Regulariser):
    """ANCHOR (`--model.anchor_coef`, `--model.anchor_layers` are its shorthands).

    Args:
        coef: λ; 0 leaves the term out (and no reference model is built).
        layers: depth fractions of the anchored hidden states: 1.0 = last layer (the one the head reads); e.g.
            [0.5, 0.75] for the intermediate variant. The term is the mean over these layers of each layer's mean of
            (h − h_ref)² over the batch's response tokens and hidden units. Logged as `train/anchor_loss` (the mean)
            and `train/anchor_term` (λ times it).
    """

    needs_hidden_states = True

    def __init__(self, coef: float = 1.0, layers: list[float] = [1.0]):
        self.coef = check_coef(coef, "--model.anchor_coef")
        check_anchor_layers(layers)
        self.layers = list(layers)
        self.layer_ids: list[int] = []  # indices into the hidden-state tuple, set by `attach`
        self.depth = 0

    @property
    def needs_reference(self) -> bool:
        return self.coef > 0

    def attach(self, module: Any, model_args: Mapping[str, Any]) -> None:
        self.depth = num_layers(module.backbone)
        self.layer_ids = anchor_layer_ids(self.layers, self.depth, self.coef, model_args["freeze_layers"])

    def keeps_reward_offset(self) -> bool:
        return self.depth in self.layer_ids  # an anchor on the last layer reads the states the head reads

    def term(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        anchor = self.loss(out.module, out.batch, out.hidden, out.prefix)
        return self.coef * anchor, {"train/anchor_loss": anchor, "train/anchor_term": self.coef * anchor.detach()}

    def loss(self, module: Any, batch: dict, hidden: tuple, prefix: Optional[tuple] = None) -> torch.Tensor:
        """Mean over anchored layers of the masked MSE to the frozen reference, on response tokens of a and b, each
        layer's term computed on the selected positions only (`losses.selected_mse`)."""
        reference = module.frozen_reference
        if reference is None:
            raise RuntimeError("--model.anchor_coef > 0 needs callbacks.reference_model.ReferenceModelCallback "
                               "in the trainer's callbacks (cli.py always adds it)")
        select = batch["response_mask"].bool()  # (2B, T)
        ref = reference.selected_hidden_states(batch["input_ids"], batch["attention_mask"], select, self.layer_ids,
                                               row_keys(batch), prefix, module.length_buckets)
        terms = [selected_mse(hidden[l][select], r) for l, r in zip(self.layer_ids, ref)]
        return torch.stack(terms).mean()


def check_anchor_layers(layers: list[float]) -> None:
    if not layers or any(not 0.0 < f <= 1.0 for f in layers):
        raise ValueError(f"--model.anchor_layers must be depth fractions in (0, 1], got {layers}")


def anchor_layer_ids(anchor_layers: list[float], n_layers: int, anchor_coef: float, freeze_layers: int) -> list[int]:
    """Indices into the hidden-state tuple (0 = embedding output, L = last layer) of the anchored depth fractions.

    An anchor must be able to move: a fraction that rounds to index 0 anchors the embedding output, not a
    transformer layer, and one on a frozen layer has an anchor term that is identically 0. Both are refused
    when the anchor is on (the protocol calls this before any training, from the config alone).
    """
    ids = sorted({round(f * n_layers) for f in anchor_layers})
    if anchor_coef <= 0:
        return ids
    if 0 in ids:
        low = [f for f in anchor_layers if round(f * n_layers) == 0]
        raise ValueError(
            f"--model.anchor_layers {anchor_layers}: depth fraction(s) {low} round to hidden state 0 of a "
            f"{n_layers}-layer backbone (index round(f * {n_layers})), the embedding output, not a transformer "
            f"layer. Choose fractions >= {1 / n_layers:.3g} (layer 1).")
    frozen = [i for i in ids if i <= freeze_layers]
    if frozen:
        raise ValueError(
            f"--model.anchor_layers {anchor_layers} anchor hidden state(s) {frozen} of a {n_layers}-layer backbone, "
            f"but --model.freeze_layers {freeze_layers} freezes the embeddings and layers 1..{freeze_layers}: their "
            f"anchor is identically 0. Choose fractions >= {(freeze_layers + 1) / n_layers:.3g} "
            f"(layer {freeze_layers + 1}).")
    return ids

