"""Log-probabilities of sampled completions, with each group's shared prompt run once.

GRPO samples G completions per prompt, and the policy (and reference) forward then runs every prompt G times.
Here the P distinct prompts go through the model once (with the KV cache), their K/V are repeated G times, and
the completions run on top of them: the same logits (to float rounding) for 1/G of the prompt work. LM logits
are computed only where the loss reads them: the last prompt position and the completion positions but the last.
Gradients flow through the repeated K/V into the prompt forward, so this serves the policy's backward as well as
the no-grad reference. Any HF causal LM with a `DynamicCache` works (`batch_repeat_interleave`).

Qwen2 / Llama take a fused path on the model's own weights (`_rope_completion_logprobs`): the prompt rows and the
completion rows go through every matmul together (one GEMM per projection, q/k/v and gate/up concatenated), with
RoPE from the model's table and one boolean mask per attention, instead of two HF calls with four GEMMs of the
q/k/v and gate/up kind each, a cache object and rebuilt masks. Same log-probs and gradients to float rounding
(tests/test_static_decoder.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_modules.fast.static_decoder import _RopeDecoder, _rms_norm, _rotate, supports
from lightning_modules.policy.causal_lm import position_ids_from_mask


def completion_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor,
                        comp_mask: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """log p(y_j | x, y_<j) for every completion token: (B, L).

    Args:
        model: an HF causal LM, or a callable forwarding to one (the reference callback).
        prompt_ids: (P, Tp) left-padded distinct prompts; row g is shared by completions g*G .. g*G+G-1.
        prompt_mask: (P, Tp) 0/1.
        completions: (B, L) with B = P * group_size.
        comp_mask: (B, L) 1 up to and including EOS (later tokens are padding: masked as keys, as in the
            full-sequence forward; their log-probs are returned but carry no meaning).
        group_size: G.
    """
    P, Tp = prompt_ids.shape
    B, L = completions.shape
    if B != P * group_size:
        raise ValueError(f"{B} completions do not split into {P} prompts x group_size {group_size}")
    if L > 1 and _fused_ok(model):
        return _rope_completion_logprobs(model, prompt_ids, prompt_mask, completions, comp_mask, group_size)
    full_mask = torch.cat([prompt_mask.repeat_interleave(group_size, dim=0), comp_mask], dim=1)  # (B, Tp + L)
    positions = position_ids_from_mask(full_mask)  # (B, Tp + L), as the full-sequence forward
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions[::group_size, :Tp],
                use_cache=L > 1, logits_to_keep=1)
    logits = out.logits[:, -1:].repeat_interleave(group_size, dim=0)  # (B, 1, V): predicts y_0
    if L > 1:
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.batch_repeat_interleave(group_size)
        rest = model(input_ids=completions[:, :-1], attention_mask=full_mask[:, :-1],
                     position_ids=positions[:, Tp:-1], cache=cache, use_cache=True).logits  # (B, L-1, V)
        logits = torch.cat([logits, rest], dim=1)  # (B, L, V)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, completions.unsqueeze(-1)).squeeze(-1)  # (B, L)


def _fused_ok(model) -> bool:
    cfg = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or getattr(cfg, "model_type", None) not in ("qwen2", "llama"):
        return False
    dropout = getattr(cfg, "attention_dropout", 0.0) if model.training else 0.0
    return supports(model) and not dropout and not getattr(cfg, "mlp_bias", False)


def _rope_completion_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completions: torch.Tensor,
                              comp_mask: torch.Tensor, G: int) -> torch.Tensor:
    """completion_logprobs for Qwen2 / Llama, prompt and completion rows in the same matmuls: (B, L)."""
    base, cfg = model.model, model.config
    P, Tp = prompt_ids.shape
    B, L = completions.shape
    Tc = L - 1  # completion inputs: tokens 0 .. L-2 (token L-1 is only a target)
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = base.layers[0].self_attn.head_dim
    full_mask = torch.cat([prompt_mask.repeat_interleave(G, dim=0), comp_mask], dim=1).bool()  # (B, Tp + L)
    positions = position_ids_from_mask(full_mask)  # (B, Tp + L), as the full-sequence forward
    cos, sin = base.rotary_emb(base.embed_tokens.weight[:1].unsqueeze(0), positions.reshape(1, -1))  # HF's table
    cos, sin = cos.view(B, Tp + L, d), sin.view(B, Tp + L, d)
    cos_p, sin_p = cos[::G, :Tp].unsqueeze(1), sin[::G, :Tp].unsqueeze(1)  # (P, 1, Tp, D)
    cos_c, sin_c = cos[:, Tp:Tp + Tc].unsqueeze(1), sin[:, Tp:Tp + Tc].unsqueeze(1)  # (B, 1, Tc, D)
    # Boolean masks (True = attend). A query may always see itself, so padding queries stay finite (their outputs
    # are never read: padding keys are masked for every real query).
    eye_p = torch.eye(Tp, dtype=torch.bool, device=prompt_ids.device)
    causal_p = torch.ones(Tp, Tp, dtype=torch.bool, device=prompt_ids.device).tril()
    mask_p = ((causal_p & prompt_mask.bool()[:, None, :]) | eye_p)[:, None]  # (P, 1, Tp, Tp)
    causal_c = torch.ones(Tc, Tc, dtype=torch.bool, device=prompt_ids.device).tril()
    keys_c = full_mask[:, :Tp + Tc]  # (B, Tp + Tc)
    mask_c = torch.cat([keys_c[:, None, :Tp].expand(B, Tc, Tp),
                        (causal_c & keys_c[:, None, Tp:]) | torch.eye(Tc, dtype=torch.bool, device=keys_c.device)],
                       dim=2)[:, None]  # (B, 1, Tc, Tp + Tc)
    n_p = P * Tp
    x = F.embedding(torch.cat([prompt_ids.reshape(-1), completions[:, :Tc].reshape(-1)]), base.embed_tokens.weight)
    for layer in base.layers:  # x: (P*Tp + B*Tc, H), prompt rows first
        w_in, (w_qkv, b_qkv), (w_o, b_o), w_post, (w_gu,), (w_down, b_down) = _RopeDecoder._layer_weights(layer)
        attn = layer.self_attn
        qkv = F.linear(_rms_norm(x, w_in, cfg.rms_norm_eps), w_qkv, b_qkv)  # (N, (nh + 2 nkv) D)
        qkv_p = qkv[:n_p].view(P, Tp, nh + 2 * nkv, d).transpose(1, 2)  # (P, heads, Tp, D)
        qkv_c = qkv[n_p:].view(B, Tc, nh + 2 * nkv, d).transpose(1, 2)  # (B, heads, Tc, D)
        qk_p = _rotate(qkv_p[:, :nh + nkv], cos_p, sin_p)
        qk_c = _rotate(qkv_c[:, :nh + nkv], cos_c, sin_c)
        k_p, v_p = qk_p[:, nh:], qkv_p[:, nh + nkv:]  # (P, nkv, Tp, D)
        att_p = F.scaled_dot_product_attention(qk_p[:, :nh], k_p, v_p, attn_mask=mask_p, scale=attn.scaling,
                                               enable_gqa=nh != nkv)  # (P, nh, Tp, D)
        k_c = torch.cat([k_p.repeat_interleave(G, dim=0), qk_c[:, nh:]], dim=2)  # (B, nkv, Tp + Tc, D)
        v_c = torch.cat([v_p.repeat_interleave(G, dim=0), qkv_c[:, nh + nkv:]], dim=2)
        att_c = F.scaled_dot_product_attention(qk_c[:, :nh], k_c, v_c, attn_mask=mask_c, scale=attn.scaling,
                                               enable_gqa=nh != nkv)  # (B, nh, Tc, D)
        att = torch.cat([att_p.transpose(1, 2).reshape(n_p, nh * d), att_c.transpose(1, 2).reshape(B * Tc, nh * d)])
        x = x + F.linear(att, w_o, b_o)
        gate, up = F.linear(_rms_norm(x, w_post, cfg.rms_norm_eps), w_gu).split(w_gu.shape[0] // 2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w_down, b_down)
    last = x[:n_p].view(P, Tp, -1)[:, -1].repeat_interleave(G, dim=0).unsqueeze(1)  # (B, 1, H): predicts y_0
    h = torch.cat([last, x[n_p:].view(B, Tc, -1)], dim=1)  # (B, L, H)
    logits = F.linear(_rms_norm(h, base.norm.weight, cfg.rms_norm_eps), model.lm_head.weight)  # (B, L, V)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, completions.unsqueeze(-1)).squeeze(-1)  # (B, L)
