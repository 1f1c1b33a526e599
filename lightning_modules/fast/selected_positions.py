"""The frozen ANCHOR reference's hidden states at the anchored (response) positions only, with the top anchored
layer's position-wise work done at those positions alone.

ANCHOR reads the reference's hidden states `hidden_states[l][select]` for its anchored layers l (response tokens).
Every layer below the top anchored one must run at every position (its outputs are the next layer's keys and
values), but the top anchored layer's own output is read at the selected positions only: its attention block still
takes every position's keys and values, while what follows it position by position (BERT: attention output dense +
LayerNorm, intermediate, output dense + LayerNorm; Qwen2 / Llama: the MLP and its norm, and the final norm when the
top layer is the last) runs on the selected rows. Layers above the top anchored one are not run at all. For the W2S
student (MiniLM, anchor on layer 6 of 6, about half of the padded positions are response tokens) that removes about
a third of the last layer's FLOPs. The values equal the full forward's at those positions to float rounding
(tests/test_selected_positions.py); backbones this does not cover use the full forward.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from lightning_modules.fast.frozen_prefix import _context, _layers, backbone_family, prefix_hidden


def selected_positions_family(backbone: nn.Module) -> Optional[str]:
    """"encoder" / "decoder" when `selected_hidden_states` covers this backbone, else None (use the full forward)."""
    family = backbone_family(backbone)
    if family is None:
        return None
    layers = _layers(backbone, family)
    if family == "encoder":
        cfg = backbone.config
        if getattr(cfg, "add_cross_attention", False) or getattr(cfg, "chunk_size_feed_forward", 0):
            return None
        parts = ("attention", "intermediate", "output")
        if not all(all(hasattr(layer, p) for p in parts) and hasattr(layer.attention, "self")
                   and hasattr(layer.attention, "output") for layer in layers):
            return None
        return family
    parts = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    return family if all(all(hasattr(layer, p) for p in parts) for layer in layers) else None


@torch.no_grad()
def selected_hidden_states(backbone: nn.Module, family: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           select: torch.Tensor, layer_ids: Sequence[int], prefix: Optional[torch.Tensor] = None,
                           k: int = 0) -> list[torch.Tensor]:
    """`[hidden_states[l][select] for l in layer_ids]` of a frozen backbone: one (n_selected, H) tensor per layer,
    rows in the row-major order of `select` (N, T).

    Args:
        backbone: a frozen backbone of `family` (`selected_positions_family`).
        family: "encoder" or "decoder".
        input_ids, attention_mask: the batch, (N, T).
        select: the positions read, (N, T) bool.
        layer_ids: indices into the hidden-state tuple (0 = embeddings, L = last layer), each >= k.
        prefix: hidden state k, (N, T, H), when the frozen prefix is shared (then input_ids is not read).
        k: the layer `prefix` is the output of.
    """
    ids = sorted(set(layer_ids))
    if not ids or ids[0] < k:
        raise ValueError(f"layer ids {list(layer_ids)} must be >= the prefix layer {k}")
    x = prefix_hidden(backbone, family, 0, input_ids, attention_mask) if prefix is None else prefix  # (N, T, H)
    if prefix is None and k != 0:
        raise ValueError("k > 0 needs the prefix hidden state")
    layers = _layers(backbone, family)
    top = ids[-1]
    out = {k: x[select]} if k in ids else {}
    if top > k:
        ctx = _context(backbone, family, x, attention_mask)
        for i in range(k + 1, top):
            x = layers[i - 1](x, **ctx)  # (N, T, H): every position, the next layer's keys and values
            if i in ids:
                out[i] = x[select]
        y = _layer_at(layers[top - 1], family, x, ctx, select)  # (n_selected, H)
        if family == "decoder" and top == len(layers):
            y = backbone.norm(y)  # HF reports the normed output as the last hidden state
        out[top] = y
    return [out[l] for l in layer_ids]


def _layer_at(layer: nn.Module, family: str, x: torch.Tensor, ctx: dict, select: torch.Tensor) -> torch.Tensor:
    """One transformer layer's output at the selected positions: attention over every position, the rest on the
    selected rows only. (n_selected, H)"""
    if family == "encoder":  # BertLayer: attention -> (dense, LayerNorm(+x)) -> intermediate -> (dense, LayerNorm(+a))
        context, _ = layer.attention.self(x, attention_mask=ctx["attention_mask"])  # (N, T, H)
        a = layer.attention.output(context[select], x[select])  # (n, H)
        return layer.output(layer.intermediate(a), a)  # (n, H)
    h = layer.input_layernorm(x)  # (N, T, H)
    attn, _ = layer.self_attn(hidden_states=h, attention_mask=ctx["attention_mask"], position_ids=ctx["position_ids"],
                              position_embeddings=ctx["position_embeddings"])  # (N, T, H)
    y = x[select] + attn[select]  # (n, H)
    return y + layer.mlp(layer.post_attention_layernorm(y))
