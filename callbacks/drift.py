"""Representational drift of the student away from its initial weights, on a fixed probe set (docs/drift.md).

At fit setup the callback holds a frozen reference of the student's initial backbone — the
`ReferenceModelCallback`'s own when that one is enabled (ANCHOR: no second copy), else its own `FrozenReference`
taken in `setup` (before a checkpoint restore, so a resumed run still compares to the initial weights) — and a
probe set: the first `probe_pairs` pairs of the ID validation split and of every OOD test split. When training
starts and at validation ends it measures, per probe split and per layer, over response tokens only, the mean
squared distance, the mean cosine of token states and the linear CKA of pooled response representations.

Under DDP every rank computes the same numbers on the same probe set (no collective, so no rank can wait on
another); only rank zero logs and writes `drift.json`.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from callbacks.reference_model import FrozenReference, ReferenceModelCallback, find_reference_callback
from lightning_modules.reward.backbones import num_layers
from lightning_modules.reward.drift_metrics import linear_cka, pooled_response
from lightning_modules.reward.losses import selected_mse

METRICS = ("mse", "cosine", "cka")


class DriftDiagnosticsCallback(Callback):
    """Measures how far the student's hidden states moved from its initial weights' on ID and OOD probe pairs.

    Args:
        probe_pairs: pairs per probe split: the first `probe_pairs` pairs (in the split's seeded record order, not
            its length-sorted loading order) of the ID validation split and of every OOD test split.
        layers: depth fractions of the measured hidden states (0 = embeddings, 1.0 = last layer, rounded as the
            model rounds `anchor_layers`); default: the model's anchored layers plus the last layer (the one the
            reward head reads, so that runs with different anchored layers still share a column).
        every_n_val: measure at every n-th validation run (sanity checks excluded). The end of training is always
            measured, so `final_drift` belongs to the final weights.
        measure_at_start: also measure when training starts (a fresh run: step 0, where drift is exactly 0).
        batch_size: probe pairs per forward (2x sequences; every layer's hidden states are held at once).
        cache_reference: keep the reference's measured states (response tokens of the measured layers, and their
            pooled rows) after the first measurement: the reference is frozen and the probe set fixed, so later
            measurements run the student only. Host memory: probe sequences × response tokens × hidden size ×
            4 bytes per measured layer (MiniLM, 64 pairs × 4 splits: ≈ 30 MB per layer).
    """

    def __init__(self, probe_pairs: int = 64, layers: Optional[list[float]] = None, every_n_val: int = 1,
                 measure_at_start: bool = True, batch_size: int = 8, cache_reference: bool = True):
        super().__init__()
        if probe_pairs < 2:
            raise ValueError(f"DriftDiagnosticsCallback: probe_pairs must be >= 2 (CKA compares examples), "
                             f"got {probe_pairs}")
        if layers is not None and (not layers or any(not 0.0 <= f <= 1.0 for f in layers)):
            raise ValueError(f"DriftDiagnosticsCallback: layers must be depth fractions in [0, 1], got {layers}")
        if every_n_val < 1:
            raise ValueError(f"DriftDiagnosticsCallback: every_n_val must be >= 1, got {every_n_val}")
        if batch_size < 1:
            raise ValueError(f"DriftDiagnosticsCallback: batch_size must be >= 1, got {batch_size}")
        self.probe_pairs, self.layers, self.every_n_val = probe_pairs, layers, every_n_val
        self.measure_at_start, self.batch_size = measure_at_start, batch_size
        self.cache_reference = bool(cache_reference)
        self._reference_states: dict[tuple[str, int], dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.reference: Optional[FrozenReference] = None
        self.owns_reference = False  # False when the ReferenceModelCallback's reference is reused
        self._shared_from: Optional[ReferenceModelCallback] = None
        self._prefix: Any = None  # the module's FrozenPrefix when the probes can use its store (`_usable_prefix`)
        self._prefix_asked = False
        self.layer_ids: list[int] = []
        self.depth = 0
        self.id_split: Optional[str] = None
        self.probes: dict[str, list[dict]] = {}  # split name -> collated CPU batches
        self.probe_info: dict[str, dict] = {}
        self.n_val = 0
        self.history: list[dict] = []  # {"step", "epoch", "drift": split -> metric -> layer<k> -> value}

    @property
    def state_key(self) -> str:
        return self._generate_state_key(probe_pairs=self.probe_pairs, layers=self.layers)

    @property
    def final_drift(self) -> dict:
        """The latest measurement: split -> "mse" | "cosine" | "cka" -> "layer<k>" -> value."""
        return self.history[-1]["drift"] if self.history else {}

    # ---- setup --------------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not hasattr(pl_module, "reference_target"):
            raise TypeError(f"DriftDiagnosticsCallback needs a module with reference_target() (e.g. "
                            f"RewardModelModule), got {type(pl_module).__name__}")
        target = pl_module.reference_target()
        self.depth = num_layers(target)
        fractions = self.layers
        if fractions is None:
            ids = set(getattr(pl_module, "anchor_layer_ids", [])) | {self.depth}
        else:
            ids = {round(f * self.depth) for f in fractions}  # the model's rounding of anchor_layers
        self.layer_ids = sorted(ids)
        self._build_probes(trainer)
        self._take_reference(trainer, pl_module, target)

    def _take_reference(self, trainer: Trainer, pl_module: LightningModule, target: nn.Module) -> None:
        ref_cb = find_reference_callback(trainer)
        # The ReferenceModelCallback copies when the module asks for a reference (coef > 0); its setup may run
        # after this one (CLI order), so its reference is picked up in `on_fit_start`.
        if ref_cb is not None and (ref_cb.enabled or float(getattr(pl_module, "reference_coef", 0.0)) > 0):
            self._shared_from, self.reference, self.owns_reference = ref_cb, ref_cb.reference, False
        elif self.reference is None:
            self.reference, self.owns_reference = FrozenReference(target, mode="auto"), True

    def _build_probes(self, trainer: Trainer) -> None:
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "datasets") or not hasattr(dm, "_collator"):
            raise ValueError("DriftDiagnosticsCallback needs a PreferenceDataModule (its validation and test splits "
                             "are the probe set)")
        collate = dm._collator()
        self.id_split = dm.source
        wanted = [(dm.source, "validation")] + [(name, f"test/{name}") for name in dm.ood_targets]
        self.probes, self.probe_info = {}, {}
        for name, kind in wanted:
            ds = dm.datasets.get(kind)
            if ds is None or len(ds) == 0:
                rank_zero_warn(f"DriftDiagnosticsCallback: split {kind!r} was not set up; no drift probe for {name}")
                continue
            items = [ds[i] for i in _first_pairs(ds, self.probe_pairs)]
            items.sort(key=lambda e: max(len(e["a_input_ids"]), len(e["b_input_ids"])))  # little padding
            self.probes[name] = [collate(items[i:i + self.batch_size]) for i in range(0, len(items), self.batch_size)]
            self.probe_info[name] = {"from": kind, "pairs": len(items)}
        if not self.probes:
            raise ValueError("DriftDiagnosticsCallback: no probe split available (validation / test splits)")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._shared_from is not None:
            self.reference = self._shared_from.reference
            if self.reference is None:
                raise RuntimeError("DriftDiagnosticsCallback: the ReferenceModelCallback built no reference although "
                                   "the module's reference_coef > 0")
        elif self.owns_reference and self.reference is not None:
            self.reference.to(pl_module.device)

    # ---- when to measure ----------------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.measure_at_start:
            self.measure(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self.reference is None or trainer.state.fn != "fit":
            return
        self.n_val += 1
        if self.n_val % self.every_n_val == 0:
            self.measure(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.history or self.history[-1]["step"] != trainer.global_step:
            self.measure(trainer, pl_module)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective call under DDP: every rank asks
        if trainer.is_global_zero and log_dir:
            self.write_json(os.path.join(log_dir, "drift.json"))

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":  # free the copy (or drop the borrowed pointer) and the probe batches
            self.reference, self._shared_from, self.owns_reference, self.probes = None, None, False, {}
            self._reference_states, self._prefix, self._prefix_asked = {}, None, False

    # ---- measurement ---------------------------------------------------------------------------------------
    def measure(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        """Drift on every probe split now; logged at the current global step and kept in `history`."""
        if self.reference is None:
            raise RuntimeError("DriftDiagnosticsCallback: no reference (measure is only available during fit)")
        target = pl_module.reference_target()
        if not self._prefix_asked:
            self._prefix, self._prefix_asked = self._usable_prefix(pl_module), True
        modes = {m: m.training for m in target.modules()}
        target.eval()
        try:
            with torch.no_grad():
                same = self._equals_reference(target)
                drift = {name: self._split_drift(target, name, batches, pl_module.device, same)
                         for name, batches in self.probes.items()}
        finally:
            for module, mode in modes.items():
                module.training = mode
        self.history.append({"step": trainer.global_step, "epoch": trainer.current_epoch, "drift": drift})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(flat_drift(drift), step=trainer.global_step)
        return drift

    def _equals_reference(self, target: nn.Module) -> bool:
        """Whether the student's weights are still the reference copy's (a fresh fit's start): its states are then
        the reference's, exactly, and need no forward of their own."""
        model = getattr(self.reference, "model", None)
        if model is None or type(model) is not type(target):
            return False
        mine, theirs = target.state_dict(), model.state_dict()
        return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)

    def _split_drift(self, target: nn.Module, name: str, batches: list[dict], device: torch.device,
                     same: bool = False) -> dict:
        sq = {k: 0.0 for k in self.layer_ids}
        cos = {k: 0.0 for k in self.layer_ids}
        pooled = {k: ([], []) for k in self.layer_ids}
        tokens = 0
        for b, batch in enumerate(batches):
            inputs = {"input_ids": batch["input_ids"].to(device), "attention_mask": batch["attention_mask"].to(device)}
            mask = batch["response_mask"].to(device)  # (2B, T)
            n_tok = int(mask.sum())
            if n_tok == 0:
                continue
            select = mask.bool()
            reference = self._reference_batch(name, b, inputs, mask)
            student = None if same else self._hidden_states(target, inputs)
            tokens += n_tok
            for k in self.layer_ids:
                r_sel, r_pooled = reference[k]  # (n_tok, H): the response tokens; (2B, H)
                if same:
                    h_sel, h_pooled = r_sel, r_pooled
                else:
                    h = student[k].float()  # (2B, T, H)
                    h_sel, h_pooled = h[select], pooled_response(h, mask).cpu()
                sq[k] += float(selected_mse(h_sel, r_sel)) * n_tok  # token-weighted: the split-wide masked_mse
                cos[k] += float(F.cosine_similarity(h_sel, r_sel, dim=-1, eps=1e-12).sum())  # masked_cosine × n_tok
                pooled[k][0].append(h_pooled)
                pooled[k][1].append(r_pooled)
        out: dict[str, dict[str, float]] = {m: {} for m in METRICS}
        for k in self.layer_ids:
            name = f"layer{k}"
            if not tokens:
                out["mse"][name] = out["cosine"][name] = out["cka"][name] = math.nan
                continue
            out["mse"][name] = sq[k] / tokens
            out["cosine"][name] = cos[k] / tokens
            out["cka"][name] = float(linear_cka(torch.cat(pooled[k][0]), torch.cat(pooled[k][1])))  # (N, H) each
        return out

    def _reference_batch(self, name: str, b: int, inputs: dict, mask: torch.Tensor) -> dict:
        """layer -> (the reference's response-token states (n_tok, H) on the device, its pooled rows (2B, H) on the
        host) for probe batch b of split `name`; kept for the fit when `cache_reference`."""
        cached = self._reference_states.get((name, b))
        if cached is not None:
            return {k: (sel.to(mask.device), pooled) for k, (sel, pooled) in cached.items()}
        hidden = (self._hidden_states(self.reference.model, inputs) if self._prefix is not None
                  else self.reference(**inputs, output_hidden_states=True).hidden_states)
        select = mask.bool()
        states = {k: (hidden[k].float()[select], pooled_response(hidden[k].float(), mask).cpu()) for k in self.layer_ids}
        if self.cache_reference:
            self._reference_states[(name, b)] = {k: (sel.cpu(), pooled) for k, (sel, pooled) in states.items()}
        return states

    def _usable_prefix(self, pl_module: LightningModule) -> Any:
        """The module's frozen-prefix store (lightning_modules/fast/frozen_prefix.py) when the probes can use it: it
        caches, every measured layer is at or above its k, and the reference is a copy with the same prefix. Then
        student and reference run layers k+1..L only over the stored hidden state k. None otherwise."""
        fp = getattr(pl_module, "frozen_prefix", None)
        model = getattr(self.reference, "model", None)
        ok = (fp is not None and fp.cache and min(self.layer_ids) >= fp.k and model is not None
              and fp.shares_prefix_with(model))
        return fp if ok else None

    def _hidden_states(self, model: nn.Module, inputs: dict) -> tuple:
        if self._prefix is not None:
            return self._prefix.hidden_states(model, inputs["input_ids"], inputs["attention_mask"])
        return model(**inputs, output_hidden_states=True).hidden_states

    # ---- results -------------------------------------------------------------------------------------------
    def summary(self, step: Optional[int] = None) -> dict:
        """The final drift (or the one measured at global `step`: a kept checkpoint that is not the final weights,
        e.g. early stopping's best; {} when no measurement was taken there), and its mean over the OOD splits:
        {"id" | "ood_mean": metric -> layer<k> -> value}."""
        if step is None:
            final = self.final_drift
        else:
            final = next((h["drift"] for h in reversed(self.history) if h["step"] == step), {})
        ood = [s for s in final if s != self.id_split]
        out: dict[str, Any] = {}
        if self.id_split in final:
            out["id"] = final[self.id_split]
        if ood:
            out["ood_mean"] = {m: {layer: sum(final[s][m][layer] for s in ood) / len(ood) for layer in final[ood[0]][m]}
                               for m in METRICS}
        return out

    def to_json(self) -> dict:
        last = self.history[-1] if self.history else {"step": None, "epoch": None}
        return _finite({
            "step": last["step"], "epoch": last["epoch"],
            "id_split": self.id_split,
            "ood_splits": [s for s in self.probe_info if s != self.id_split],
            "probes": self.probe_info,
            "layers": {f"layer{k}": k / self.depth for k in self.layer_ids} if self.depth else {},
            "final": self.final_drift,
            "summary": self.summary(),
            "history": self.history,
        })

    def write_json(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=2)
        os.replace(tmp, path)

    # ---- checkpoint: a resumed run keeps its history and validation count ------------------------------------
    def state_dict(self) -> dict:
        return {"n_val": self.n_val, "history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.n_val = int(state_dict.get("n_val", 0))
        self.history = list(state_dict.get("history", []))


def flat_drift(drift: dict) -> dict[str, float]:
    """split -> metric -> layer<k> -> value as log keys `drift/<split>/<metric>/layer<k>`."""
    return {f"drift/{split}/{metric}/{layer}": value
            for split, metrics in drift.items()
            for metric, layers in metrics.items()
            for layer, value in layers.items()}


def _first_pairs(ds, n: int) -> list[int]:
    """Rows of the n pairs that come first in the split's record order (evaluation splits are length-sorted)."""
    cols = getattr(ds, "cols", None)
    order = cols["index"] if cols is not None else [ds[i]["index"] for i in range(len(ds))]
    return sorted(range(len(order)), key=order.__getitem__)[:n]


def _finite(obj: Any) -> Any:
    """NaN / inf -> None, so that drift.json stays strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
