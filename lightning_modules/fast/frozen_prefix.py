"""Run a backbone's frozen prefix (embeddings + layers 1..k) once, and optionally once per training sequence.

With `--model.freeze_layers k` the student and the frozen ANCHOR reference are the same function below layer k+1
(the reference is a copy taken before training, and frozen weights never change), and for a fixed sequence that
function's output, hidden state k, is the same in every epoch. So a training step computes hidden state k once,
hands it to the student's upper layers (with gradients) and to the reference's (under no_grad). With the cache it
is computed once per *sequence* for the whole process: rows are keyed by their content, and every module whose
prefix has the same fingerprint (weights, config, k) shares one store, so the W2S protocol's students (all above the
same pretrained layers), their validation, test and drift probes compute each sequence's prefix once
(`shared_store.py`). Padding positions never reach a real position (the attention mask hides them as keys), so the
store keeps real positions only and re-pads with zeros per batch.

Supported: BERT-style encoders (MiniLM) and plain Qwen2 / Llama decoders (rotary embeddings, causal mask); other
backbones, LoRA, gradient checkpointing, and a prefix that still has trainable parameters or applies dropout are
refused by `check_supported` (such a prefix's output changes every step).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from lightning_modules.fast.length_buckets import bucketed_positions
from lightning_modules.fast.shared_store import Store, sequence_keys, shared_store, weights_fingerprint

FLAGS = "--model.share_frozen_prefix / --model.cache_frozen_prefix"


def backbone_family(backbone: nn.Module) -> Optional[str]:
    """"encoder" (BertModel-like), "decoder" (Qwen2 / Llama-like) or None (not supported)."""
    cfg = getattr(backbone, "config", None)
    if hasattr(backbone, "peft_config") or getattr(backbone, "gradient_checkpointing", False):
        return None
    if all(hasattr(backbone, a) for a in ("embeddings", "encoder")) and not getattr(cfg, "is_decoder", False):
        return "encoder" if isinstance(getattr(backbone.encoder, "layer", None), nn.ModuleList) else None
    if getattr(cfg, "model_type", None) in ("qwen2", "llama") and all(
            hasattr(backbone, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        types = getattr(cfg, "layer_types", None) or []
        return "decoder" if all(t == "full_attention" for t in types) else None  # no sliding-window masks
    return None


def check_supported(backbone: nn.Module, freeze_layers: int) -> str:
    family = backbone_family(backbone)
    if family is None:
        raise ValueError(f"{FLAGS}: supported for BERT-style encoders and Qwen2/Llama decoders without LoRA or "
                         f"gradient checkpointing, not {type(backbone).__name__}; turn the flag off")
    n = len(_layers(backbone, family))
    if not 1 <= freeze_layers < n:
        raise ValueError(f"{FLAGS} need --model.freeze_layers in [1, {n - 1}] (a frozen prefix and a trainable "
                         f"layer above it), got {freeze_layers}")
    prefix = [_embeddings(backbone, family), *_layers(backbone, family)[:freeze_layers]]
    trainable = [name for module in prefix for name, p in module.named_parameters() if p.requires_grad]
    if trainable:
        # a prefix parameter that trains changes the prefix's output every step: it cannot be shared or cached
        raise ValueError(f"{FLAGS}: the prefix below layer {freeze_layers + 1} still has trainable parameters "
                         f"({', '.join(trainable[:4])}{', ...' if len(trainable) > 4 else ''}), so its output is "
                         "not fixed; turn the flag off")
    cfg = backbone.config
    dropout = [n for n in ("attention_probs_dropout_prob", "attention_dropout") if getattr(cfg, n, 0.0)]
    dropout += [name for module in prefix for name, m in module.named_modules()
                if isinstance(m, nn.Dropout) and m.p > 0]
    if dropout:
        # a training-mode dropout makes the prefix's output random: one evaluation cannot stand for every step
        raise ValueError(f"{FLAGS}: the prefix applies dropout ({', '.join(dropout[:4])}); keep "
                         "--model.disable_dropout true or turn the flag off")
    return family


def _embeddings(backbone: nn.Module, family: str) -> nn.Module:
    return backbone.embeddings if family == "encoder" else backbone.embed_tokens


def _layers(backbone: nn.Module, family: str) -> nn.ModuleList:
    return backbone.encoder.layer if family == "encoder" else backbone.layers


def _context(backbone: nn.Module, family: str, x: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """What every layer needs besides its input: the mask as the backbone builds it, and rotary embeddings."""
    if family == "encoder":
        from transformers.masking_utils import create_bidirectional_mask

        return {"attention_mask": create_bidirectional_mask(config=backbone.config, inputs_embeds=x,
                                                            attention_mask=attention_mask)}
    from transformers.masking_utils import create_causal_mask

    position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T): the backbone's default
    mask = create_causal_mask(config=backbone.config, inputs_embeds=x, attention_mask=attention_mask, cache=None,
                              position_ids=position_ids)
    return {"attention_mask": mask, "position_ids": position_ids,
            "position_embeddings": backbone.rotary_emb(x, position_ids)}


@torch.no_grad()
def prefix_hidden(backbone: nn.Module, family: str, k: int, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor) -> torch.Tensor:
    """Hidden state k (the output of layer k): (N, T, H)."""
    embed = _embeddings(backbone, family)
    x = embed(input_ids=input_ids) if family == "encoder" else embed(input_ids)  # (N, T, H)
    ctx = _context(backbone, family, x, attention_mask)
    for layer in _layers(backbone, family)[:k]:
        x = layer(x, **ctx)  # (N, T, H)
    return x


def upper_hidden_states(backbone: nn.Module, family: str, k: int, h_k: torch.Tensor,
                        attention_mask: torch.Tensor, buckets: int = 1) -> tuple:
    """The backbone's `hidden_states` tuple from hidden state k: indices 0..L, with None below k (frozen states,
    which ANCHOR never reads: `anchor_layer_ids` refuses them). The last entry is `last_hidden_state`.
    `buckets` > 1 runs a right-padded batch as up to that many length buckets (`bucketed_positions`): padding
    positions then hold other values, which neither the pooled head nor the anchor (response tokens) reads."""
    if buckets > 1:
        return bucketed_positions(lambda h, m: upper_hidden_states(backbone, family, k, h, m), h_k, attention_mask,
                                  buckets)
    ctx = _context(backbone, family, h_k, attention_mask)
    states: list = [None] * k + [h_k]
    x = h_k
    for layer in _layers(backbone, family)[k:]:
        x = layer(x, **ctx)  # (N, T, H)
        states.append(x)
    if family == "decoder":
        states[-1] = backbone.norm(x)  # HF reports the normed output as the last hidden state
    return tuple(states)


def prefix_fingerprint(backbone: nn.Module, family: str, k: int, tag: str = "") -> str:
    """A digest of what hidden state k is a function of: the prefix's parameters and buffers, its config, k and
    `tag` (what the owner changes outside the weights, e.g. a vocabulary limit applied by a hook)."""
    return weights_fingerprint([_embeddings(backbone, family), *_layers(backbone, family)[:k]], backbone.config,
                               f"{family}|{k}|{tag}")


class FrozenPrefix:
    """Hidden state k of a backbone whose embeddings and layers 1..k are frozen, optionally memoised per sequence.

    With `cache`, rows are keyed by their content (`shared_store.sequence_keys`) in a process-wide store shared by
    every module with the same prefix fingerprint: training (from the second epoch no prefix forward), validation,
    test and the drift probes all read it. The fingerprint is taken at the first call and again after `invalidate`
    (the module calls it whenever its weights may have been loaded).

    Args:
        backbone: the student's backbone (its frozen prefix is shared with the reference).
        k: `--model.freeze_layers`.
        cache: memoise hidden state k per sequence (host memory, real positions).
        max_mb: the store's budget in MiB; past it, new sequences are computed every time (one warning).
        tag: what else the prefix's function depends on besides its weights and config (e.g. a vocabulary limit).
        buckets: run the prefix over at most this many length buckets of a right-padded batch
            (`--model.length_buckets`).
    """

    def __init__(self, backbone: nn.Module, k: int, cache: bool = False, max_mb: float = 2048.0, tag: str = "",
                 buckets: int = 1):
        if max_mb < 0:
            raise ValueError(f"--model.prefix_cache_max_mb must be >= 0, got {max_mb}")
        self.family = check_supported(backbone, k)
        self.backbone, self.k, self.cache, self.max_bytes, self.tag = backbone, k, cache, int(max_mb * 2 ** 20), tag
        self.buckets = buckets
        self.fingerprint: Optional[str] = None
        self.prefix_forwards = 0  # rows whose prefix was computed (not read back): what the store saves

    def invalidate(self) -> None:
        """The weights may have changed (a checkpoint was loaded): fingerprint the prefix again at the next call."""
        self.fingerprint = None

    def current_fingerprint(self) -> str:
        if self.fingerprint is None:
            self.fingerprint = prefix_fingerprint(self.backbone, self.family, self.k, self.tag)
        return self.fingerprint

    @property
    def store(self) -> Store:
        return shared_store("frozen prefix", self.current_fingerprint(), self.max_bytes, "--model.prefix_cache_max_mb")

    def shares_prefix_with(self, model: nn.Module) -> bool:
        """Whether `model` (e.g. a frozen reference copy) has this prefix: same family, weights, config and tag."""
        return (backbone_family(model) == self.family
                and prefix_fingerprint(model, self.family, self.k, self.tag) == self.current_fingerprint())

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Hidden state k for the batch, (N, T, H); rows already in the store are read back, the others computed."""
        if not self.cache:
            self.prefix_forwards += len(input_ids)
            return self._compute(input_ids, attention_mask)
        store, keys, real = self.store, sequence_keys(input_ids, attention_mask), attention_mask.bool()  # real (N, T)
        missing = [r for r, key in enumerate(keys) if key not in store.rows]
        computed = {}
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            h = self._compute(input_ids[rows], attention_mask[rows])
            self.prefix_forwards += len(missing)
            for j, r in enumerate(missing):
                computed[r] = h[j][real[r]]  # (n_real, H)
                store.put(keys[r], computed[r].cpu())  # host memory: the store can outgrow an accelerator's
        per_row = [computed[r] if r in computed else store.rows[key].to(input_ids.device) for r, key in enumerate(keys)]
        out = per_row[0].new_zeros(*real.shape, per_row[0].shape[-1])  # (N, T, H)
        out[real] = torch.cat(per_row)  # row-major order of `real` = row by row
        return out

    def _compute(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        fn = lambda ids, m: (prefix_hidden(self.backbone, self.family, self.k, ids, m),)  # noqa: E731
        return bucketed_positions(fn, input_ids, attention_mask, self.buckets)[0]  # (N, T, H)

    def hidden_states(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
        """`model`'s hidden_states tuple (None below k) from this prefix: the student's backbone, or a copy that
        `shares_prefix_with` it."""
        return upper_hidden_states(model, self.family, self.k, self(input_ids, attention_mask), attention_mask,
                                   self.buckets)

    @property
    def stored_rows(self) -> int:  # not __len__: an empty store would make the object falsy
        return len(self.store.rows)
