"""Log-probabilities of sampled completions, with each group's shared prompt run once.

GRPO samples G completions per prompt, and the policy (and reference) forward then runs every prompt G times.
Here the P distinct prompts go through the model once (with the KV cache), their K/V are repeated G times, and
the completions run on top of them: the same logits (to float rounding) for 1/G of the prompt work. LM logits
are computed only where the loss reads them: the last prompt position and the completion positions but the last.
Gradients flow through the repeated K/V into the prompt forward, so this serves the policy's backward as well as
the no-grad reference. Any HF causal LM with a `DynamicCache` works (`batch_repeat_interleave`).
"""
from __future__ import annotations

import torch

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
