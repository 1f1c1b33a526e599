"""A lean batched KV-cache sampler for small policies (same contract as `policy_base.sample_completions`).

At the policies' size (a few million parameters) a decode step's FLOPs take well under a millisecond; HF
`generate` spends several milliseconds per step in Python (logits processors, stopping criteria, input
preparation). This loop keeps only the model call and the draw: one prefill with the KV cache, then one call
per new token; rows stop at EOS, the loop stops when every row has. Positions start at 0 on the first real
token (as `causal_lm.position_ids_from_mask`, so sampling and training see the same positions).
`--model.sampler kv_loop` of the policy modules; `static_decoder.sample_static` (the default) falls back to it for
architectures it does not reproduce.
"""
from __future__ import annotations

import torch


@torch.no_grad()
def sample_with_kv_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                         temperature: float, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to `max_new_tokens` after left-padded prompts; returns completions (B, L) and their mask (B, L)
    (1 up to and including the first EOS; later positions hold `pad_id`). `temperature` 0 = greedy."""
    was_training = model.training
    model.eval()
    B = input_ids.shape[0]
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, Tp)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    past, logits = out.cache, out.logits[:, -1]  # (B, V)
    next_pos = positions[:, -1:] + 1  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    ones = torch.ones((B, 1), dtype=mask.dtype, device=mask.device)
    tokens = []
    for step in range(max_new_tokens):
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1).squeeze(1)  # (B,)
        else:
            nxt = logits.argmax(dim=-1)
        nxt = nxt.masked_fill(done, pad_id)
        tokens.append(nxt)
        done = done | (nxt == eos_id)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, ones], dim=1)
        out = model(input_ids=nxt.unsqueeze(1), attention_mask=mask, position_ids=next_pos, cache=past,
                    use_cache=True)
        past, logits = out.cache, out.logits[:, -1]
        next_pos = next_pos + 1
    model.train(was_training)
    comp = torch.stack(tokens, dim=1) if tokens else torch.full((B, 1), pad_id, dtype=torch.long,
                                                                 device=input_ids.device)  # (B, L)
    is_eos = (comp == eos_id).long()
    comp_mask = ((is_eos.cumsum(dim=1) - is_eos) == 0).long()  # up to and including the first EOS
    return comp.masked_fill(comp_mask == 0, pad_id), comp_mask
