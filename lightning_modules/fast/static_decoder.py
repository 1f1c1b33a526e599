"""Static-KV-cache sampling for the policies' architectures (Qwen2 / Llama, GPT-2): the decode steps run directly
on the model's own weights.

At the policies' size (a few million parameters) a decode step's FLOPs take well under a millisecond, while one
HF forward costs several milliseconds of Python: a Cache object's `torch.cat` per layer, a 4-D mask rebuilt every
step, rotary tables recomputed, output dataclasses, hooks. Here the prompt is prefilled by the HF model itself
(one call; its K/V are copied into tensors preallocated for the whole completion), then each new token is one
pass of plain tensor ops per layer: q/k/v from one fused matmul, RoPE from a precomputed table, K/V written in
place at the step's column, SDPA against a fixed key-padding mask, fused gate/up. The weights are read (and
q/k/v, gate/up concatenated) once per call, so sampling always uses the current parameters.

Scoring while sampling (`sample_and_score`): other models of the same architecture (GRPO's frozen reference) run
their decode step on the same tokens in the same pass -- their rows are stacked under the policy's in every
attention, activation and residual op, only the weight-bearing ops (embeddings, norms, matmuls) run per model --
and return their log-probabilities of the sampled tokens, so no separate forward of theirs is needed afterwards.
The policy's own rows go through the same ops on the same values, so its draws do not change.

Exact (fp32): per-step logits equal the HF model's full forward to float rounding (tests/test_static_decoder.py, on
left-padded batches), greedy completions equal HF `generate`'s, and a draw is `multinomial(softmax(logits / T))`
like `generate`'s with top-k 0 / top-p 1. Other architectures, or configs outside what is reproduced here
(sliding windows, scaled GPT-2 attention variants), fall back to `fast_sampling.sample_with_kv_cache`.
"""
from __future__ import annotations

from typing import Optional, Sequence

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


def _per_model(fn, x: torch.Tensor, weights: list) -> torch.Tensor:
    """fn(x[m], *weights[m]) for each of the M models: x (M, B, ...) -> (M, B, ...)."""
    if len(weights) == 1:
        return fn(x[0], *weights[0]).unsqueeze(0)
    return torch.stack([fn(x[m], *w) for m, w in enumerate(weights)])


def _addmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.addmm(b, x, w)


class _RopeDecoder:
    """Qwen2 / Llama decode step of M models at once (M = 1: the policy alone); weights read (and fused) at
    construction. Activations are (M, B, ...): per-model ops index the first dim, the rest run on all rows."""

    def __init__(self, models: Sequence, max_len: int):
        cfg, base = models[0].config, models[0].model
        first = base.layers[0].self_attn
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, first.head_dim
        self.scaling, self.eps = first.scaling, cfg.rms_norm_eps
        self.embed = [(m.model.embed_tokens.weight,) for m in models]
        self.norm = torch.stack([m.model.norm.weight for m in models]).unsqueeze(1)  # (M, 1, H)
        self.lm_head = [(m.lm_head.weight,) for m in models]
        self.layers = []
        for i in range(len(base.layers)):
            per_model = [self._layer_weights(m.model.layers[i]) for m in models]
            self.layers.append((
                torch.stack([w[0] for w in per_model]).unsqueeze(1),  # input norm (M, 1, H)
                [w[1] for w in per_model],  # (w_qkv, b_qkv)
                [w[2] for w in per_model],  # (w_o, b_o)
                torch.stack([w[3] for w in per_model]).unsqueeze(1),  # post-attention norm (M, 1, H)
                [w[4] for w in per_model],  # (w_gate_up,)
                [w[5] for w in per_model],  # (w_down, b_down)
            ))
        self.inter = base.layers[0].mlp.gate_proj.weight.shape[0]
        positions = torch.arange(max_len, device=base.embed_tokens.weight.device).unsqueeze(0)  # (1, S)
        cos, sin = base.rotary_emb(base.embed_tokens.weight[:1].unsqueeze(0), positions)  # (1, S, D): HF's tables
        self.cos, self.sin = cos[0], sin[0]  # (S, D)

    @staticmethod
    def _layer_weights(layer) -> tuple:
        a, m = layer.self_attn, layer.mlp
        biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
        b_qkv = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else p.weight.new_zeros(p.weight.shape[0])
             for b, p in zip(biases, (a.q_proj, a.k_proj, a.v_proj))])
        return (layer.input_layernorm.weight, (torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), b_qkv),
                (a.o_proj.weight, a.o_proj.bias), layer.post_attention_layernorm.weight,
                (torch.cat([m.gate_proj.weight, m.up_proj.weight]),), (m.down_proj.weight, m.down_proj.bias))

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, col: int, keys: list, values: list,
             key_mask: torch.Tensor) -> torch.Tensor:
        """tokens, positions (B,); writes K/V (M*B rows) at column `col`; key_mask (M*B, 1, 1, col + 1) bool
        -> logits (M, B, V)."""
        B, nh, nkv, d = tokens.shape[0], self.n_heads, self.n_kv, self.head_dim
        M = len(self.embed)
        x = _per_model(F.embedding, tokens.expand(M, B), self.embed)  # (M, B, H)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # (B, 1, D)
        for i, (w_in, qkv_w, o_w, w_post, gu_w, down_w) in enumerate(self.layers):
            qkv = _per_model(F.linear, _rms_norm(x, w_in, self.eps), qkv_w)  # (M, B, (nh + 2 nkv) D)
            qk = _rotate(qkv[..., :(nh + nkv) * d].view(M, B, nh + nkv, d), cos, sin)  # (M, B, nh + nkv, D)
            keys[i][:, :, col] = qk[:, :, nh:].reshape(M * B, nkv, d)
            values[i][:, :, col] = qkv[..., (nh + nkv) * d:].reshape(M * B, nkv, d)
            att = F.scaled_dot_product_attention(
                qk[:, :, :nh].reshape(M * B, nh, 1, d), keys[i][:, :, :col + 1], values[i][:, :, :col + 1],
                attn_mask=key_mask, scale=self.scaling, enable_gqa=nh != nkv)  # (M*B, nh, 1, D)
            x = x + _per_model(F.linear, att.reshape(M, B, nh * d), o_w)
            gate, up = _per_model(F.linear, _rms_norm(x, w_post, self.eps), gu_w).split(self.inter, dim=-1)
            x = x + _per_model(F.linear, F.silu(gate) * up, down_w)  # gate, up (M, B, I)
        return _per_model(F.linear, _rms_norm(x, self.norm, self.eps), self.lm_head)  # (M, B, V)


class _GPT2Decoder:
    """GPT-2 decode step of M models at once (Conv1D weights are (in, out): x @ W + b); activations (M, B, ...)."""

    def __init__(self, models: Sequence, max_len: int):
        cfg, tr = models[0].config, models[0].transformer
        self.n_heads, self.eps = cfg.n_head, cfg.layer_norm_epsilon
        self.head_dim = cfg.n_embd // cfg.n_head
        self.scaling = self.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0
        trs = [m.transformer for m in models]
        self.wte = [(t.wte.weight,) for t in trs]
        self.wpe = [(t.wpe.weight,) for t in trs]
        self.lm_head = [(m.lm_head.weight,) for m in models]
        self.ln_f = [(t.ln_f.weight, t.ln_f.bias) for t in trs]
        self.act = tr.h[0].mlp.act  # the model's own activation module (gelu_new, ...)
        self.layers = []
        for i in range(len(tr.h)):
            blocks = [t.h[i] for t in trs]
            self.layers.append((
                [(b.ln_1.weight, b.ln_1.bias) for b in blocks], [(b.attn.c_attn.weight, b.attn.c_attn.bias) for b in blocks],
                [(b.attn.c_proj.weight, b.attn.c_proj.bias) for b in blocks], [(b.ln_2.weight, b.ln_2.bias) for b in blocks],
                [(b.mlp.c_fc.weight, b.mlp.c_fc.bias) for b in blocks], [(b.mlp.c_proj.weight, b.mlp.c_proj.bias) for b in blocks],
            ))
        if max_len > tr.wpe.weight.shape[0]:
            raise ValueError(f"prompt + max_new_tokens = {max_len} exceeds GPT-2's {tr.wpe.weight.shape[0]} positions")

    def _ln(self, x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), g, b, self.eps)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, col: int, keys: list, values: list,
             key_mask: torch.Tensor) -> torch.Tensor:
        B, nh, d = tokens.shape[0], self.n_heads, self.head_dim
        H, M = nh * d, len(self.wte)
        x = _per_model(F.embedding, tokens.expand(M, B), self.wte) + _per_model(F.embedding, positions.expand(M, B),
                                                                                self.wpe)  # (M, B, H)
        for i, (ln1, attn, proj, ln2, fc, out) in enumerate(self.layers):
            qkv = _per_model(_addmm, _per_model(self._ln, x, ln1), attn)  # (M, B, 3H)
            keys[i][:, :, col] = qkv[..., H:2 * H].reshape(M * B, nh, d)
            values[i][:, :, col] = qkv[..., 2 * H:].reshape(M * B, nh, d)
            att = F.scaled_dot_product_attention(
                qkv[..., :H].reshape(M * B, nh, 1, d), keys[i][:, :, :col + 1], values[i][:, :, :col + 1],
                attn_mask=key_mask, scale=self.scaling)  # (M*B, nh, 1, D)
            x = x + _per_model(_addmm, att.reshape(M, B, H), proj)
            hidden = self.act(_per_model(_addmm, _per_model(self._ln, x, ln2), fc))  # (M, B, 4H)
            x = x + _per_model(_addmm, hidden, out)
        return _per_model(F.linear, _per_model(self._ln, x, self.ln_f), self.lm_head)  # (M, B, V)


def _decoder(models: Sequence, max_len: int):
    return (_GPT2Decoder if models[0].config.model_type == "gpt2" else _RopeDecoder)(models, max_len)


def can_score(model, scorers: Sequence) -> bool:
    """Whether `scorers` can run their decode steps with `model`'s in `sample_and_score` (same architecture)."""
    if not supports(model):
        return False
    shape = lambda m: (m.config.model_type, sorted((k, tuple(v.shape)) for k, v in m.state_dict().items()))  # noqa: E731
    return all(supports(s) and type(s) is type(model) and shape(s) == shape(model) for s in scorers)


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
    comp, comp_mask, _ = sample_and_score(model, (), input_ids, attention_mask, max_new_tokens, temperature, eos_id,
                                          pad_id, generator, step_logits)
    return comp, comp_mask


@torch.no_grad()
def sample_and_score(model, scorers: Sequence, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     max_new_tokens: int, temperature: float, eos_id: int, pad_id: int,
                     generator: Optional[torch.Generator] = None, step_logits: Optional[list] = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """`sample_static`, plus each scorer's log p(y_j | x, y_<j) of the sampled tokens: (B, L) per scorer, from
    its logits at temperature 1 (completion_logprobs' values to float rounding; after a row's EOS they carry no
    meaning). The scorers are models of `model`'s architecture and shapes (`can_score`)."""
    if not can_score(model, scorers):
        raise ValueError("sample_and_score needs a supported architecture and scorers of the same shapes")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    models = [model, *scorers]
    was_training = [m.training for m in models]
    for m in models:
        m.eval()
    B, Tp = input_ids.shape
    M, S = len(models), Tp + max_new_tokens
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, Tp): 0 on the first real token, as in training
    # GRPO repeats each prompt G times: prefill each run of identical rows once and repeat its K/V.
    first, counts = _row_runs(input_ids, mask)
    dec = _decoder(models, S)
    keys = [None] * len(dec.layers)
    values = [None] * len(dec.layers)
    logits = []
    for m, lm in enumerate(models):  # rows m*B .. m*B + B - 1 of every K/V tensor belong to model m
        out = lm(input_ids=input_ids[first], attention_mask=mask[first], position_ids=positions[first],
                 use_cache=True, logits_to_keep=1)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        logits.append(_expand(out.logits[:, -1], counts))  # (B, V)
        for i in range(len(dec.layers)):
            k, v = _cache_kv(cache, i)  # (U, KVH, Tp, D), U unique prompts
            if keys[i] is None:
                keys[i] = k.new_empty(M * B, k.shape[1], S, k.shape[3])
                values[i] = v.new_empty(M * B, v.shape[1], S, v.shape[3])
            keys[i][m * B:(m + 1) * B, :, :Tp] = _expand(k, counts)
            values[i][m * B:(m + 1) * B, :, :Tp] = _expand(v, counts)
        del out, cache
    logits = torch.stack(logits)  # (M, B, V)
    key_mask = torch.ones(B, 1, 1, S, dtype=torch.bool, device=input_ids.device)
    key_mask[:, 0, 0, :Tp] = mask.bool()  # prompt padding stays masked; every generated column is attended
    key_mask = key_mask.repeat(M, 1, 1, 1)  # (M*B, 1, 1, S)
    next_pos = positions[:, -1] + 1  # (B,)
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    tokens, scores = [], []
    for step in range(max_new_tokens):
        if step_logits is not None:
            step_logits.append(logits[0].clone())
        nxt = _draw(logits[0], temperature, generator).masked_fill(done, pad_id)  # (B,)
        tokens.append(nxt)
        if M > 1:  # (M-1, B): the scorers' log-probs of the drawn tokens
            scores.append(torch.log_softmax(logits[1:].float(), dim=-1).gather(
                -1, nxt.expand(M - 1, B).unsqueeze(-1)).squeeze(-1))
        done = done | (nxt == eos_id)
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        col = Tp + step
        logits = dec.step(nxt, next_pos, col, keys, values, key_mask[..., :col + 1])
        next_pos = next_pos + 1
    for m, training in zip(models, was_training):
        m.train(training)
    comp = torch.stack(tokens, dim=1)  # (B, L)
    is_eos = (comp == eos_id).long()
    comp_mask = ((is_eos.cumsum(dim=1) - is_eos) == 0).long()  # up to and including the first EOS
    scored = list(torch.stack(scores, dim=2).unbind(0)) if M > 1 else []  # (B, L) per scorer
    return comp.masked_fill(comp_mask == 0, pad_id), comp_mask, scored
