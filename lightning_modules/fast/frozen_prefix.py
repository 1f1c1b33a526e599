"""Run a backbone's frozen prefix (embeddings + layers 1..k) once, and optionally once per training sequence.

With `--model.freeze_layers k` the student and the frozen ANCHOR reference are the same function below layer k+1
(the reference is a copy taken before training, and frozen weights never change), and for a fixed sequence that
function's output, hidden state k, is the same in every epoch. So a training step computes hidden state k once,
hands it to the student's upper layers (with gradients) and to the reference's (under no_grad); with the cache it
is computed once per training sequence for the whole fit. Padding positions never reach a real position (the
attention mask hides them as keys), so the cache keeps real positions only and re-pads with zeros per batch.

Supported: BERT-style encoders (MiniLM) and plain Qwen2 / Llama decoders (rotary embeddings, causal mask); other
backbones, LoRA, gradient checkpointing and a prefix that still has trainable parameters are refused by
`check_supported` (a prefix that still trains, e.g. a backbone whose freezing a caller undid, changes every step).
"""
from __future__ import annotations

import warnings
from typing import Hashable, Optional, Sequence

import torch
from torch import nn

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
                        attention_mask: torch.Tensor) -> tuple:
    """The backbone's `hidden_states` tuple from hidden state k: indices 0..L, with None below k (frozen states,
    which ANCHOR never reads: `anchor_layer_ids` refuses them). The last entry is `last_hidden_state`."""
    ctx = _context(backbone, family, h_k, attention_mask)
    states: list = [None] * k + [h_k]
    x = h_k
    for layer in _layers(backbone, family)[k:]:
        x = layer(x, **ctx)  # (N, T, H)
        states.append(x)
    if family == "decoder":
        states[-1] = backbone.norm(x)  # HF reports the normed output as the last hidden state
    return tuple(states)


class FrozenPrefix:
    """Hidden state k of a backbone whose embeddings and layers 1..k are frozen, optionally memoised per sequence.

    Args:
        backbone: the student's backbone (its frozen prefix is shared with the reference).
        k: `--model.freeze_layers`.
        cache: memoise hidden state k per training-sequence key for the whole fit (host memory, real positions).
        max_mb: the cache's budget in MiB; past it, new sequences are computed every time (one warning).
    """

    def __init__(self, backbone: nn.Module, k: int, cache: bool = False, max_mb: float = 2048.0):
        if max_mb < 0:
            raise ValueError(f"--model.prefix_cache_max_mb must be >= 0, got {max_mb}")
        self.family = check_supported(backbone, k)
        self.backbone, self.k, self.cache, self.max_bytes = backbone, k, cache, int(max_mb * 2 ** 20)
        self.clear()

    def clear(self) -> None:
        self._store: dict[Hashable, torch.Tensor] = {}
        self.bytes, self.full = 0, False

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 keys: Optional[Sequence[Hashable]] = None) -> torch.Tensor:
        """Hidden state k for the batch, (N, T, H); rows with a cached key are read back, the others computed."""
        if not (self.cache and keys is not None):
            return prefix_hidden(self.backbone, self.family, self.k, input_ids, attention_mask)
        real = attention_mask.bool()  # (N, T)
        missing = [r for r, key in enumerate(keys) if key not in self._store]
        computed = {}
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            h = prefix_hidden(self.backbone, self.family, self.k, input_ids[rows], attention_mask[rows])
            for j, r in enumerate(missing):
                computed[r] = h[j][real[r]]  # (n_real, H)
                self._remember(keys[r], computed[r])
        per_row = [computed[r] if r in computed else self._store[key].to(input_ids.device) for r, key in enumerate(keys)]
        for key, vals, n in zip(keys, per_row, real.sum(dim=1).tolist()):
            if vals.shape[0] != n:
                raise ValueError(f"{FLAGS}: sequence {key!r} had {vals.shape[0]} real positions, now {n} "
                                 "(keys must identify one sequence)")
        out = per_row[0].new_zeros(*real.shape, per_row[0].shape[-1])  # (N, T, H)
        out[real] = torch.cat(per_row)  # row-major order of `real` = row by row
        return out

    def _remember(self, key: Hashable, vals: torch.Tensor) -> None:
        size = vals.numel() * vals.element_size()
        if self.full:
            return
        if self.bytes + size > self.max_bytes:  # the first sequence past the budget closes the cache for the fit
            self.full = True
            warnings.warn(f"--model.prefix_cache_max_mb: the frozen-prefix cache reached its budget "
                          f"({self.bytes / 2 ** 20:.1f} MiB, {len(self._store)} sequences); further sequences "
                          "are recomputed every step", stacklevel=3)
            return
        self._store[key] = vals.cpu()  # host memory: the cache can outgrow an accelerator's
        self.bytes += size

    def __len__(self) -> int:
        return len(self._store)
