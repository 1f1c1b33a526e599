"""Last-token reward scoring that skips the last layer's work for positions the head never reads.

With "last" pooling the reward reads one hidden state per row: the final layer's output at the last real token.
That layer still needs every position's keys and values (the pooled token attends to all of them), but its
queries, attention output, o-projection and MLP are needed at the pooled position only: for a Qwen2/Llama layer
that is ~90% of the layer's matmul work, ~20% of a 4-layer model's. The lower layers run as HF's own modules
(same mask construction, same SDPA path); the last layer is recomputed here from its weights for one query per
row. The rewards and their gradients equal the full forward's to float rounding (tests/test_last_token_scoring.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.reward.heads import last_token_index


def supports_last_token_scoring(backbone: nn.Module) -> bool:
    """A plain (no peft wrapper, no gradient checkpointing, no attention dropout) Qwen2 / Llama base model."""
    cfg = getattr(backbone, "config", None)
    if getattr(cfg, "model_type", None) not in ("qwen2", "llama") or hasattr(backbone, "peft_config"):
        return False
    if not all(hasattr(backbone, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if getattr(backbone, "gradient_checkpointing", False) or getattr(cfg, "attention_dropout", 0.0) != 0.0:
        return False
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return False
    return all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in backbone.layers)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def last_token_hidden(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The backbone's final (normed) hidden state at each row's last non-padding token: (N, H).

    Same positions as the backbone called without `position_ids` (0..T-1), so right and left padding give what
    `backbone(input_ids, attention_mask).last_hidden_state` gives at those tokens.
    """
    from transformers.masking_utils import create_causal_mask

    N, T = input_ids.shape
    x = backbone.embed_tokens(input_ids)  # (N, T, H)
    position_ids = torch.arange(T, device=x.device).unsqueeze(0)  # (1, T)
    mask = create_causal_mask(config=backbone.config, inputs_embeds=x, attention_mask=attention_mask, cache=None,
                              position_ids=position_ids)  # None when nothing is padded: SDPA's causal path
    cos, sin = backbone.rotary_emb(x, position_ids)  # (1, T, D)
    for layer in backbone.layers[:-1]:
        x = layer(x, attention_mask=mask, position_embeddings=(cos, sin), position_ids=position_ids)
    last = backbone.layers[-1]
    attn = last.self_attn
    nh, nkv, d = backbone.config.num_attention_heads, backbone.config.num_key_value_heads, attn.head_dim
    idx = last_token_index(attention_mask)  # (N,)
    rows = torch.arange(N, device=x.device)
    h = last.input_layernorm(x)  # (N, T, H): every position's keys and values are read
    k = _rotate(attn.k_proj(h).view(N, T, nkv, d).transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1))  # (N, kv, T, D)
    v = attn.v_proj(h).view(N, T, nkv, d).transpose(1, 2)  # (N, kv, T, D)
    q = attn.q_proj(h[rows, idx]).view(N, nh, 1, d)  # (N, nh, 1, D): the pooled position only
    q = _rotate(q, cos[0, idx][:, None, None], sin[0, idx][:, None, None])
    keys = torch.arange(T, device=x.device).unsqueeze(0) <= idx.unsqueeze(1)  # (N, T): causal for the pooled row
    keys = (keys & attention_mask.bool()).view(N, 1, 1, T)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, scale=attn.scaling, enable_gqa=nh != nkv)
    y = x[rows, idx] + attn.o_proj(out.reshape(N, nh * d))  # (N, H)
    y = y + last.mlp(last.post_attention_layernorm(y))
    return backbone.norm(y)  # (N, H)
