"""The frozen reference model, held by a callback so it never enters the LightningModule's module tree.

Kept out of the module tree means: not in `state_dict` (so not in checkpoints), not in the optimizer, not wrapped
by DDP, not toggled by `.train()` / `.eval()`. Used by ANCHOR (reference hidden states, Part A), GRM's DPO form
(reference log-probs of responses, Part A) and the KL term of GRPO (reference log-probs, Part B).

Protocol with the LightningModule (the module never imports this file; the callback hands itself in):
- `pl_module.reference_coef` (float): 0 means "no reference needed" -> nothing is copied.
- `pl_module.reference_target()` returns the `nn.Module` to freeze (e.g. the backbone or the policy LM).
- optional `pl_module.reference_head()`: an LM head to freeze with it (None: none). A reward model's GRM "dpo" form
  asks for its causal LM's head; `.response_log_probs(...)` then gives log π_ref of the response tokens.
- the callback sets `pl_module.frozen_reference = self` for the fit (None otherwise); inside `training_step` the
  module calls `self.frozen_reference(**inputs)` (under no_grad), or `.selected_hidden_states(...)` for hidden
  states at chosen positions, which `cache_outputs` can memoise.
"""
from __future__ import annotations

import copy
from typing import Any, Hashable, Literal, Optional, Sequence

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

from lightning_modules.fast.length_buckets import bucketed_positions
from lightning_modules.fast.shared_store import Store, sequence_keys, shared_store, weights_fingerprint

ReferenceMode = Literal["auto", "copy", "disable_adapter"]


def is_peft_model(module: nn.Module) -> bool:
    return hasattr(module, "disable_adapter") and hasattr(module, "peft_config")


class FrozenReference:
    """The initial weights of `target`, frozen: a deep copy, or (LoRA) the live model with adapters disabled.

    Args:
        target: the module whose current weights become the reference.
        mode: "auto" (adapters disabled for a peft model, else a copy), "copy" or "disable_adapter".
        head: an LM head reading `target`'s last hidden states, frozen with it (`self.head`): copied together with
            the target (a head tied to its input embeddings stays tied: one copy of the matrix), or, with adapters
            disabled, the live head, which must then be frozen already (else it would not stay the initial one).
    """

    def __init__(self, target: nn.Module, mode: ReferenceMode = "auto", head: Optional[nn.Module] = None):
        if mode not in ("auto", "copy", "disable_adapter"):
            raise ValueError(f"--reference.mode must be auto, copy or disable_adapter, got {mode!r}")
        if mode == "disable_adapter" and not is_peft_model(target):
            raise ValueError("--reference.mode disable_adapter needs a LoRA (peft) model; set --model.lora or use copy")
        if is_peft_model(target) and mode != "copy":
            # No second copy of the weights: the base with adapters disabled *is* the initial model, as long as
            # the base stays frozen (LoRA trains adapters only).
            self.mode, self.model, self._target = "disable_adapter", None, target
            if head is not None and any(p.requires_grad for p in head.parameters()):
                raise ValueError("a reference with adapters disabled shares the live LM head, which trains: use "
                                 "--reference.mode copy or freeze the head")
            self.head = head
        else:
            self.mode, self._target = "copy", None
            if head is None:
                self.model, self.head = copy.deepcopy(target).requires_grad_(False).eval(), None
            else:  # one deepcopy: a Parameter shared by target and head (tied embeddings) is copied once
                model, head = copy.deepcopy((target, head))
                self.model, self.head = model.requires_grad_(False).eval(), head.requires_grad_(False).eval()

    @property
    def backbone(self) -> nn.Module:
        """The module whose forward is the reference's (the copy, or the live model run with adapters disabled)."""
        return self.model if self.model is not None else self._target

    def to(self, device: Any) -> "FrozenReference":
        if self.model is not None:
            self.model.to(device)
            if self.head is not None:
                self.head.to(device)
        return self

    @torch.no_grad()  # not inference_mode: its outputs enter a loss that is backpropagated
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "copy":
            return self.model(*args, **kwargs)
        # in eval mode, as the copy is: the live model trains with its dropout on (a policy's GPT-2 base), and the
        # reference must not draw dropout noise; each submodule's own mode is put back after the call
        modes = [(m, m.training) for m in self._target.modules()]
        self._target.eval()
        try:
            with self._target.disable_adapter():
                return self._target(*args, **kwargs)
        finally:
            for m, training in modes:
                m.training = training

    def parameter_count(self) -> int:
        """Parameters this reference adds to memory (0 with adapters disabled); a tied head's weight counts once."""
        if self.model is None:
            return 0
        params = {id(p): p for m in (self.model, self.head) if m is not None for p in m.parameters()}
        return sum(p.numel() for p in params.values())


class ReferenceModelCallback(Callback):
    """Holds the frozen reference, taken at `setup` (before any checkpoint restore: the *initial* weights).

    Args:
        mode: "auto" uses the LoRA base with adapters disabled when the target is a peft model (no second copy of
            the weights) and a full frozen deep copy otherwise; "copy" always deep-copies; "disable_adapter"
            requires a peft target.
        cache_outputs: memoise `selected_hidden_states` per sequence: the reference is frozen and a training
            sequence is the same every epoch, so from the second epoch on ANCHOR needs no reference forward. A
            copied reference keys rows by their content (tokens, anchored positions and layers) in a store shared by
            every fit of the process whose reference has the same weights (lightning_modules/fast/shared_store.py):
            the ANCHOR stages of a W2S protocol's seed (a λ sweep) evaluate it once. A LoRA reference (adapters
            disabled) keeps a per-fit cache by pair index. Costs host memory: anchored layers × selected tokens ×
            hidden size × 4 bytes per training sequence (synthetic benchmark, MiniLM: ≈ 40 kB per sequence; a 7B
            model: ≈ 5 MB) -- leave it off for large models or datasets.
        cache_max_mb: the shared store's budget in MiB; past it new sequences are recomputed (one warning).
    """

    def __init__(self, mode: ReferenceMode = "auto", cache_outputs: bool = False, cache_max_mb: float = 4096.0):
        super().__init__()
        if mode not in ("auto", "copy", "disable_adapter"):
            raise ValueError(f"--reference.mode must be auto, copy or disable_adapter, got {mode!r}")
        if cache_max_mb < 0:
            raise ValueError(f"--reference.cache_max_mb must be >= 0, got {cache_max_mb}")
        self.mode = mode
        self.cache_outputs = bool(cache_outputs)
        self.cache_max_bytes = int(cache_max_mb * 2 ** 20)
        self.reference: Optional[FrozenReference] = None
        self._cache: dict[Hashable, tuple[torch.Tensor, ...]] = {}  # per fit, by row key (a LoRA reference)
        self._store: Optional[Store] = None  # shared, by content (a copied reference)
        self.reference_rows = 0  # rows the reference ran for (not read back): what the caches save

    @property
    def enabled(self) -> bool:
        return self.reference is not None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or self.reference is not None:
            return
        if float(getattr(pl_module, "reference_coef", 0.0)) == 0.0:
            return  # coefficient 0: no copy at all
        head = pl_module.reference_head() if hasattr(pl_module, "reference_head") else None
        self.reference = FrozenReference(pl_module.reference_target(), self.mode, head)
        pl_module.frozen_reference = self  # a plain attribute: a Callback is no nn.Module, so never a submodule
        model = self.reference.model
        if self.cache_outputs and model is not None:
            fingerprint = weights_fingerprint([model], getattr(model, "config", None), type(model).__name__)
            self._store = shared_store("reference", fingerprint, self.cache_max_bytes, "--reference.cache_max_mb")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.reference is not None:
            self.reference.to(pl_module.device)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self.reference, self._cache, self._store = None, {}, None
            if getattr(pl_module, "frozen_reference", None) is self:
                pl_module.frozen_reference = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.reference is None:
            raise RuntimeError("the reference model was not set up: reference_coef is 0 or the stage is not fit")
        return self.reference(*args, **kwargs)

    @torch.no_grad()
    def selected_hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, select: torch.Tensor,
                               layer_ids: Sequence[int], keys: Optional[Sequence[Hashable]] = None,
                               prefix: Optional[tuple] = None, buckets: int = 1) -> list[torch.Tensor]:
        """The reference's hidden states `layer_ids` (0 = embeddings) at the positions where `select` (N, T) is
        set, rows in order: one (n_selected, H) tensor per layer, the rows of `hidden_states[l][select]`.

        With `cache_outputs`, only rows never seen run through the reference; the others are read back: for a copied
        reference from the shared store (keyed by content), else from the fit's cache by `keys` (one per row, the
        same for the same sequence in every epoch). `prefix` = (family, k,
        h_k (N, T, H)) is the student's hidden state k from a frozen prefix the reference shares
        (lightning_modules/fast/frozen_prefix.py): the reference then runs layers k+1..L only. `buckets` > 1 runs a
        right-padded batch as up to that many length buckets (same rows to float rounding).
        """
        select = select.bool()
        if self._store is not None:  # content keys: the same sequence, positions and layers in any fit
            suffix = repr(list(layer_ids)).encode()
            keys = [k + suffix for k in sequence_keys(input_ids, attention_mask, select)]
            lookup, remember = self._store.get, self._store.put
        elif self.cache_outputs and keys is not None:
            if len(keys) != len(input_ids):
                raise ValueError(f"{len(keys)} cache keys for {len(input_ids)} rows")
            lookup, remember = self._cache.get, self._cache.__setitem__
        else:
            self.reference_rows += len(input_ids)
            return self._selected(input_ids, attention_mask, select, layer_ids, prefix, buckets)
        found = [lookup(k) for k in keys]
        missing = [r for r, vals in enumerate(found) if vals is None]
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            sub_prefix = None if prefix is None else (*prefix[:2], prefix[2][rows])
            states = self._selected(input_ids[rows], attention_mask[rows], select[rows], layer_ids, sub_prefix, buckets)
            self.reference_rows += len(missing)
            counts = select[rows].sum(dim=1).tolist()
            per_layer = [s.cpu().split(counts) for s in states]  # host memory: the cache can outgrow an accelerator's
            for j, r in enumerate(missing):
                found[r] = tuple(rows_l[j] for rows_l in per_layer)
                remember(keys[r], found[r])
        per_row = found
        counts = select.sum(dim=1).tolist()
        for k, vals, n in zip(keys, per_row, counts):
            if vals[0].shape[0] != n:
                raise ValueError(f"reference cache: sequence {k!r} had {vals[0].shape[0]} selected positions, "
                                 f"now {n} (keys must identify one sequence)")
        return [torch.cat([vals[i] for vals in per_row]).to(input_ids.device) for i in range(len(layer_ids))]

    @torch.no_grad()
    def response_log_probs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, select: torch.Tensor,
                           reduction: str = "sum", keys: Optional[Sequence[Hashable]] = None,
                           prefix: Optional[tuple] = None, buckets: int = 1) -> torch.Tensor:
        """log π_ref per row, (N,): the frozen LM head on the reference's last hidden states at the `select` (N, T)
        positions, scoring each position's next token, summed or averaged over the row
        (`lightning_modules.reward.grm.sequence_log_probs`). The states come from `selected_hidden_states` (the
        last layer only, so `cache_outputs`, `prefix` and `buckets` apply as there; `keys` must differ from the
        ANCHOR rows' keys of the same sequences when both use a per-fit cache)."""
        from lightning_modules.reward.backbones import num_layers
        from lightning_modules.reward.grm import sequence_log_probs

        if self.reference is None or self.reference.head is None:
            raise RuntimeError("the reference has no LM head: the module's reference_head() gave none at setup "
                               "(GRM's dpo form needs one)")
        last = num_layers(self.reference.backbone)
        states = self.selected_hidden_states(input_ids, attention_mask, select, [last], keys, prefix, buckets)[0]
        return sequence_log_probs(states, self.reference.head, select.bool(), input_ids, reduction)

    def _selected(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, select: torch.Tensor,
                  layer_ids: Sequence[int], prefix: Optional[tuple], buckets: int = 1) -> list[torch.Tensor]:
        """`hidden_states[l][select]` per anchored layer; a copied BERT / Qwen2 / Llama reference computes its top
        anchored layer at the selected positions only and skips the layers above it (fast/selected_positions.py),
        over up to `buckets` length buckets of a right-padded batch (`--model.length_buckets`)."""
        from lightning_modules.fast.selected_positions import selected_hidden_states, selected_positions_family

        model = None if self.reference is None else self.reference.model
        family = None if model is None else selected_positions_family(model)
        if family is not None and (prefix is None or prefix[0] == family):
            k, h_k = (0, None) if prefix is None else prefix[1:]

            def at_positions(x, mask, sel, ids):  # one bucket's selected states, scattered back to (n, T_b, H)
                states = selected_hidden_states(model, family, ids, mask, sel, layer_ids, None if h_k is None else x, k)
                return tuple(s.new_zeros(*sel.shape, s.shape[-1]).index_put_((sel,), s) for s in states)

            full = bucketed_positions(at_positions, input_ids if h_k is None else h_k, attention_mask, buckets,
                                      extra=(select, input_ids))
            return [f[select] for f in full]
        hidden = self._hidden_states(input_ids, attention_mask, prefix)
        return [hidden[l][select] for l in layer_ids]

    def _hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: Optional[tuple]):
        if prefix is None:
            return self(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states
        if self.reference is None or self.reference.model is None:
            raise RuntimeError("a shared frozen prefix needs a copied reference (--reference.mode copy, no LoRA)")
        from lightning_modules.fast.frozen_prefix import upper_hidden_states

        family, k, h_k = prefix
        return upper_hidden_states(self.reference.model, family, k, h_k, attention_mask)  # under no_grad


def find_reference_callback(trainer: Optional[Trainer]) -> Optional[ReferenceModelCallback]:
    if trainer is None:
        return None
    for cb in trainer.callbacks:
        if isinstance(cb, ReferenceModelCallback):
            return cb
    return None
