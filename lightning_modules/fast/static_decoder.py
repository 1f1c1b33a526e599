"""Static-KV-cache sampling for the policies' architectures (Qwen2 / Llama, GPT-2): the decode steps run directly
on the model's own weights.

At the policies' size (a few million parameters) a decode step's FLOPs take well under a millisecond, while one
HF forward costs several milliseconds of Python: a Cache object's `torch.cat` per layer, a 4-D mask rebuilt every
step, rotary tables recomputed, output dataclasses, hooks. Here the prompt is prefilled by the HF model itself
(one call; its K/V are copied into tensors preallocated for the whole completion), then each new token is one
pass of plain tensor ops per layer: q/k/v from one fused matmul, RoPE from a precomputed table, K/V written in
place at the step's column, SDPA against a fixed key-padding mask, fused gate/up. The weights are read (and
q/k/v, gate/up concatenated) once per call, so sampling always uses the current parameters.

Exact (fp32): per-step logits equal the HF model's full forward to float rounding (tests/test_static_decoder.py, on
left-padded batches), greedy completions equal HF `generate`'s, and a draw is `multinomial(softmax(logits / T))`
like `generate`'s with top-k 0 / top-p 1. Other architectures, or configs outside what is reproduced here
(sliding windows, scaled GPT-2 attention variants), fall back to `fast_sampling.sample_with_kv_cache`.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from lightning_modules.fast.kv_cache_sampling import sample_with_kv_cache


def supports(model) -> bool:
    """Whether `model` is a causal LM whose decode step this module reproduces exactly."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind in ("qwen2", "llama"):
        base = getattr(model, "model", None)
        if base is None or not hasattr(base, "rotary_emb") or getattr(model, "lm_head", None) is None:
            return False
        if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
            return False
        rope = getattr(cfg, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") == "dynamic":  # tables would change with the length
            return False
        mlp = base.layers[0].mlp
        return getattr(mlp, "gate_proj", None) is not None and getattr(cfg, "hidden_act", None) == "silu"
    if kind == "gpt2":
        return (not getattr(cfg, "add_cross_attention", False) and not cfg.scale_attn_by_inverse_layer_idx
                and not cfg.reorder_and_upcast_attn and hasattr(model, "transformer"))
    return False


def _cache_kv(cache, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's (keys, values) of an HF cache, (B, KVH, T, D), across the cache layouts of transformers versions."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[i].keys, layers[i].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[i], cache.value_cache[i]
    return cache[i][0], cache[i][1]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # HF's Qwen2/Llama RMSNorm, op for op (in fp32 the casts are no-ops)
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _RopeDecoder:
    """Qwen2 / Llama decode step; weights read (and fused) at construction."""

    def __init__(self, model, max_len: int):
        cfg, base = model.config, model.model
        first = base.layers[0].self_attn
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, first.head_dim
        self.scaling, self.eps = first.scaling, cfg.rms_norm_eps
        self.embed, self.norm, self.lm_head = base.embed_tokens.weight, base.norm.weight, model.lm_head.weight
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
            b_qkv = None if all(b is None for b in biases) else torch.cat(
                [b if b is not None else p.weight.new_zeros(p.weight.shape[0])
                 for b, p in zip(biases, (a.q_proj, a.k_proj, a.v_proj))])
            self.layers.append((
                layer.input_layernorm.weight,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), b_qkv,
                a.o_proj.weight, a.o_proj.bias,
                layer.post_attention_layernorm.weight,
                torch.cat([m.gate_proj.weight, m.up_proj.weight]), m.down_proj.weight, m.down_proj.bias,
            ))
        self.inter = base.layers[0].mlp.gate_proj.weight.shape[0]
        positions = torch.arange(max_len, device=self.embed.device).unsqueeze(0)  # (1, S)
        cos, sin = base.rotary_emb(self.embed[:1].unsqueeze(0), positions)  # (1, S, D): HF's own tables
        self.cos, self.sin = cos[0], sin[0]  # (S, D)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, col: int, keys: list, values: list,
             key_mask: torch.Tensor) -> torch.Tensor:
        """tokens, positions (B,); writes K/V at column `col`; key_mask (B, 1, 1, col + 1) bool -> logits (B, V)."""
        B, nh, nkv, d = tokens.shape[0], self.n_heads, self.n_kv, self.head_dim
        x = F.embedding(tokens, self.embed)  # (B, H)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # (B, 1, D)
        for i, (w_in, w_qkv, b_qkv, w_o, b_o, w_post, w_gu, w_down, b_down) in enumerate(self.layers):
            qkv = F.linear(_rms_norm(x, w_in, self.eps), w_qkv, b_qkv)  # (B, (nh + 2 nkv) D)
            qk = _rotate(qkv[:, :(nh + nkv) * d].view(B, nh + nkv, d), cos, sin)  # (B, nh + nkv, D)
            keys[i][:, :, col] = qk[:, nh:]
            values[i][:, :, col] = qkv[:, (nh + nkv) * d:].view(B, nkv, d)
            att = F.scaled_dot_product_attention(
                qk[:, :nh].unsqueeze(2), keys[i][:, :, :col + 1], values[i][:, :, :col + 1], attn_mask=key_mask,
                scale=self.scaling, enable_gqa=nh != nkv)  # (B, nh, 1, D)
            x = x + F.linear(att.reshape(B, nh * d), w_o, b_o)
            gate, up = F.linear(_rms_norm(x, w_post, self.eps), w_gu).split(self.inter, dim=-1)  # (B, I) each
            x = x + F.linear(F.silu(gate) * up, w_down, b_down)
        return F.linear(_rms_norm(x, self.norm, self.eps), self.lm_head)  # (B, V)


class _GPT2Decoder:
    """GPT-2 decode step (Conv1D weights are (in, out): x @ W + b)."""

    def __init__(self, model, max_len: int):
        cfg, tr = model.config, model.transformer
        self.n_heads, self.eps = cfg.n_head, cfg.layer_norm_epsilon
        self.head_dim = cfg.n_embd // cfg.n_head
        self.scaling = self.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0
        self.wte, self.wpe, self.lm_head = tr.wte.weight, tr.wpe.weight, model.lm_head.weight
        self.ln_f = (tr.ln_f.weight, tr.ln_f.bias)
        self.act = tr.h[0].mlp.act  # the model's own activation module (gelu_new, ...)
        self.layers = [(b.ln_1.weight, b.ln_1.bias, b.attn.c_attn.weight, b.attn.c_attn.bias, b.attn.c_proj.weight,
                        b.attn.c_proj.bias, b.ln_2.weight, b.ln_2.bias, b.mlp.c_fc.weight, b.mlp.c_fc.bias,
                        b.mlp.c_proj.weight, b.mlp.c_proj.bias) for b in tr.h]
        if max_len > self.wpe.shape[0]:
            raise ValueError(f"prompt + max_new_tokens = {max_len} exceeds GPT-2's {self.wpe.shape[0]} positions")

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, col: int, keys: list, values: list,
             key_mask: torch.Tensor) -> torch.Tensor:
        B, nh, d = tokens.shape[0], self.n_heads, self.head_dim
        H = nh * d
        x = F.embedding(tokens, self.wte) + F.embedding(positions, self.wpe)  # (B, H)
        for i, (g1, b1, w_attn, b_attn, w_proj, b_proj, g2, b2, w_fc, b_fc, w_out, b_out) in enumerate(self.layers):
            qkv = torch.addmm(b_attn, F.layer_norm(x, (H,), g1, b1, self.eps), w_attn)  # (B, 3H)
            keys[i][:, :, col] = qkv[:, H:2 * H].view(B, nh, d)
            values[i][:, :, col] = qkv[:, 2 * H:].view(B, nh, d)
            att = F.scaled_dot_product_attention(
                qkv[:, :H].view(B, nh, 1, d), keys[i][:, :, :col + 1], values[i][:, :, :col + 1],
                attn_mask=key_mask, scale=self.scaling)  # (B, nh, 1, D)
            x = x + torch.addmm(b_proj, att.reshape(B, H), w_proj)
            hidden = self.act(torch.addmm(b_fc, F.layer_norm(x, (H,), g2, b2, self.eps), w_fc))  # (B, 4H)
            x = x + torch.addmm(b_out, hidden, w_out)
        return F.linear(F.layer_norm(x, (H,), *self.ln_f, self.eps), self.lm_head)  # (B, V)


def _decoder(model, max_len: int):
    return _GPT2Decoder(model, max_len) if model.config.model_type == "gpt2" else _RopeDecoder(model, max_len)


def _row_runs(input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Index of the first row of each run of identical consecutive rows (U,), and the run lengths (None: all 1)."""
    same = ((input_ids[1:] == input_ids[:-1]) & (mask[1:] == mask[:-1])).all(dim=1)  # (B-1,)
    if not bool(same.any()):
        return torch.arange(len(input_ids), device=input_ids.device), None
    starts = torch.cat([same.new_ones(1), ~same]).nonzero().squeeze(1)  # (U,)
    ends = torch.cat([starts[1:], starts.new_tensor([len(input_ids)])])
    return starts, ends - starts


def _expand(x: torch.Tensor, counts: Optional[torch.Tensor]) -> torch.Tensor:
    return x if counts is None else x.repeat_interleave(counts, dim=0)


def _draw(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(dim=-1)
    scores = logits.float() if temperature == 1.0 else logits.float() / temperature
    return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)  # (B,)


@torch.no_grad()
def sample_static(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                  temperature: float, eos_id: int, pad_id: int, generator: Optional[torch.Generator] = None,
                  step_logits: Optional[list] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to `max_new_tokens` after left-padded prompts; returns completions (B, L) and their mask (B, L)
    (1 up to and including the first EOS; later positions hold `pad_id`). `temperature` 0 = greedy.

    `generator` makes the draws reproducible independently of the global RNG (None = the global RNG, as
    `generate`). `step_logits`, when a list, receives each step's (B, V) logits (for the exactness tests).
    Unsupported architectures go to `fast_sampling.sample_with_kv_cache` (same contract).
    """
    if not supports(model):
        if generator is not None:
            raise ValueError(f"sample_static: a generator needs a supported architecture, not {type(model).__name__}")
        return sample_with_kv_cache(model, input_ids, attention_mask, max_new_tokens, temperature, eos_id, pad_id)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    was_training = model.training
    model.eval()
    B, Tp = input_ids.shape
    S = Tp + max_new_tokens
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, Tp): 0 on the first real token, as in training
    # GRPO repeats each prompt G times: prefill each run of identical rows once and repeat its K/V.
    first, counts = _row_runs(input_ids, mask)
    out = model(input_ids=input_ids[first], attention_mask=mask[first], position_ids=positions[first], use_cache=True,
                logits_to_keep=1)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    logits = _expand(out.logits[:, -1], counts)  # (B, V)
    dec = _decoder(model, S)
    keys, values = [], []
    for i in range(len(dec.layers)):
        k, v = _cache_kv(cache, i)  # (U, KVH, Tp, D), U unique prompts
        keys.append(k.new_empty(B, k.shape[1], S, k.shape[3]))
        values.append(v.new_empty(B, v.shape[1], S, v.shape[3]))
        keys[i][:, :, :Tp] = _expand(k, counts)
        values[i][:, :, :Tp] = _expand(v, counts)
    del out, cache
    key_mask = torch.ones(B, 1, 1, S, dtype=torch.bool, device=input_ids.device)
    key_mask[:, 0, 0, :Tp] = mask.bool()  # prompt padding stays masked; every generated column is attended
    next_pos = positions[:, -1] + 1  # (B,)
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    tokens = []
    for step in range(max_new_tokens):
        if step_logits is not None:
            step_logits.append(logits.clone())
        nxt = _draw(logits, temperature, generator).masked_fill(done, pad_id)  # (B,)
        tokens.append(nxt)
        done = done | (nxt == eos_id)
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        col = Tp + step
        logits = dec.step(nxt, next_pos, col, keys, values, key_mask[..., :col + 1])
        next_pos = next_pos + 1
    model.train(was_training)
    comp = torch.stack(tokens, dim=1)  # (B, L)
    is_eos = (comp == eos_id).long()
    comp_mask = ((is_eos.cumsum(dim=1) - is_eos) == 0).long()  # up to and including the first EOS
    return comp.masked_fill(comp_mask == 0, pad_id), comp_mask
