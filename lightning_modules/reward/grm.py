"""GRM (Yang et al., NeurIPS 2024, "Regularizing Hidden States Enables Learning Generalizable Reward Model"): the
pieces a reward model needs to keep its causal LM's head and score log π(y | x) of a response
(docs/robust_baselines.md).

The reward head and the LM head read the same last hidden states; the text-generation loss on them (the GRM term)
keeps those states good for generation while the reward head learns preferences. Pure tensor code: the loss forms
are in `losses.py` (`grm_sft_loss`, `grm_dpo_loss`), the wiring in `RewardModelModule.grm_loss`, the frozen
reference's side in callbacks/reference_model.py.

log π(y | x) is the **sum** over the response tokens of log softmax(lm_head(h_{t−1}))[y_t] by default, as in the
public code (YangRui2015/Generalizable-Reward-Model, `GRMRewardTrainer.get_batch_logps`: a sum over the label
tokens, the prompt masked with -100); "mean" (per-token average) is an option.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

GRM_FORMS = ("sft", "dpo", "dpo_noref")
LOGP_REDUCTIONS = ("sum", "mean")


def check_grm_options(coef: float, form: str, beta: float, reduction: str) -> None:
    """Refuse, naming the flag, values the GRM term cannot use (called at construction, from the config alone)."""
    if not (isinstance(coef, (int, float)) and 0.0 <= coef < 1.0):
        raise ValueError(f"--model.grm_coef must be in [0, 1) (α of (1 − α)·L_pref + α·L_reg; 1 would drop the "
                         f"preference loss), got {coef!r}")
    if form not in GRM_FORMS:
        raise ValueError(f"--model.grm_form must be one of {GRM_FORMS}, got {form!r}")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"--model.grm_beta must be > 0, got {beta!r}")
    if reduction not in LOGP_REDUCTIONS:
        raise ValueError(f"--model.grm_logp_reduction must be one of {LOGP_REDUCTIONS}, got {reduction!r}")


def prediction_positions(response_mask: torch.Tensor, attention_mask: torch.Tensor,
                         rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(N, T) bool: the positions t whose next token t+1 is a response token, t itself a real token (a causal LM
    predicts token t+1 from position t). A response token at position 0 has no prediction and is left out (as the
    shift of HF's causal-LM loss does); with left padding the position before the first real token is padding, so
    a response without a prompt loses its first token the same way. `rows` (N,) bool keeps only those rows."""
    select = torch.zeros_like(response_mask, dtype=torch.bool)  # (N, T)
    select[:, :-1] = response_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    if rows is not None:
        select &= rows.bool().unsqueeze(1)
    return select


def sequence_log_probs(states: torch.Tensor, lm_head: nn.Module, select: torch.Tensor, input_ids: torch.Tensor,
                       reduction: str = "sum") -> torch.Tensor:
    """log π(y | x) per row, (N,): the LM head's log-probability of each next token after the `select` positions,
    summed (or averaged, "mean") over the row's selected positions; 0 for a row with none.

    states: (n, H), the last hidden states at the selected positions, rows in the row-major order of `select`
    (`hidden[select]`); select: (N, T) bool (`prediction_positions`); input_ids: (N, T). The logits are computed
    at the n selected positions only (never (N, T, V)) and in float32 (the public code upcasts them too).
    """
    rows = select.nonzero()[:, 0]  # (n,)
    targets = input_ids[:, 1:][select[:, :-1]]  # (n,): the token each selected position predicts
    logits = lm_head(states.to(lm_head.weight.dtype)).float()  # (n, V)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (n,)
    total = picked.new_zeros(select.shape[0]).index_add(0, rows, picked)  # (N,)
    if reduction == "mean":
        return total / select.sum(dim=1).clamp(min=1).to(total.dtype)
    return total


def split_causal_lm(causal: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(base transformer, LM head) of an `AutoModelForCausalLM` model. A tied head keeps sharing its weight with
    the base's input embeddings (one Parameter: freezing the embeddings freezes the head)."""
    head = causal.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(causal).__name__} has no language-model head (get_output_embeddings() is None)")
    return causal.base_model, head
