"""Pure tensor losses of the reward-model objectives (docs/w2s.md). No Lightning here: easy to test alone.

Notation: margin Δ_i = r(x_i, a_i) − r(x_i, b_i); q_i = P(a_i ≻ b_i) under the labels (1.0 for gold labels
with a = chosen).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(margin: torch.Tensor) -> torch.Tensor:
    """Gold Bradley–Terry: mean of −log σ(Δ) with a = chosen."""
    return -F.logsigmoid(margin).mean()


def soft_bradley_terry_loss(margin: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Naive W2S: −[q log σ(Δ) + (1−q) log σ(−Δ)] = BCE-with-logits(Δ, q), mean over pairs."""
    return F.binary_cross_entropy_with_logits(margin, q.to(margin.dtype))


def hardened_student_labels(margin: torch.Tensor, q: torch.Tensor, rule: str = "top") -> torch.Tensor:
    """Burns et al.'s hardening of the student's own predictions, for pairs (detached 0/1 labels, shape of Δ).

    rule "top" (SPEC, the default): the top round(mean(q)·B) pairs of the batch by σ(Δ) get 1, the rest 0 -- the
        weak labels' class balance exactly (round half to even); ties at the threshold are broken by `topk`.
    rule "quantile" (openai/weak-to-strong's `logconf_loss_fn`): threshold t = the mean(q) quantile (linear
        interpolation) of 1 − σ(Δ) over the batch; label 1 iff 1 − σ(Δ) < t, strictly. With B distinct margins
        that is ceil(mean(q)·(B−1)) positives, not round(mean(q)·B) (B = 5, mean(q) = 0.7: 3 vs 4); tied margins
        all fall on one side; a batch of one always gets 0.
    """
    margin = margin.detach()
    if rule == "quantile":
        one_minus_p = torch.sigmoid(-margin.float())
        threshold = torch.quantile(one_minus_p, q.float().mean().clamp(0.0, 1.0))
        return (one_minus_p < threshold).to(margin.dtype)
    if rule != "top":
        raise ValueError(f"hardening rule must be 'top' or 'quantile', got {rule!r}")
    batch = margin.shape[0]
    n_pos = int(torch.round(q.float().mean() * batch).item())
    hard = torch.zeros_like(margin)
    if n_pos > 0:
        hard[torch.topk(margin, k=n_pos).indices] = 1.0
    return hard


def confidence_w2s_loss(margin: torch.Tensor, q: torch.Tensor, coef: float, rule: str = "top") -> torch.Tensor:
    """Confidence-based W2S: BCE-with-logits(Δ, (1−c)·q + c·ĥ) with ĥ the detached hardened student labels."""
    target = (1.0 - coef) * q.to(margin.dtype) + coef * hardened_student_labels(margin, q, rule)
    return F.binary_cross_entropy_with_logits(margin, target)


def masked_mse(hidden: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the masked tokens *and* the hidden units of (h − h_ref)²; 0 when the mask is empty.

    hidden, reference: (N, T, H); mask: (N, T) with 1 on response tokens.
    """
    select = mask.bool()
    return selected_mse(hidden[select], reference[select])


def selected_mse(hidden: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Mean over positions and hidden units of (h − h_ref)² for pre-selected positions: hidden, reference (n, H);
    0 when n = 0. `masked_mse` and the ANCHOR term both reduce to it."""
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0  # keeps the graph (and DDP's view of used parameters)
    return ((hidden - reference.to(hidden.dtype)) ** 2).mean()


def reward_centering_loss(rewards_a: torch.Tensor, rewards_b: torch.Tensor) -> torch.Tensor:
    """Eisenstein et al.'s centering term mean((r_a + r_b)²), keeping rewards near zero mean."""
    return ((rewards_a + rewards_b) ** 2).mean()



def batch_sum_to_zero_loss(rewards_a: torch.Tensor, rewards_b: torch.Tensor) -> torch.Tensor:
    """Hong et al.'s (ICML 2025) batch-wise sum-to-zero term B·(mean of the batch's 2B rewards)², B = pairs.

    Equals (Σ r)² / (4B): the squared *batch* sum, where reward centering squares each pair's sum. The factor B is
    the public code's (LinkedIn-XFACT/RM-Robustness scales λ by the per-device train batch size).
    """
    pairs = rewards_a.shape[0]
    return pairs * torch.cat([rewards_a, rewards_b]).mean().square()


# Logits of q at the ends: q ∈ {0, 1} has logit ∓∞; tempering keeps an end where it is (σ(±∞ / T) = the end), and
# every other q is clamped to this logit range first (|logit| = 30 is q = 1 − 9e-14: beyond float32 resolution).
LABEL_LOGIT_RANGE = 30.0


def soften_labels(q: torch.Tensor, temperature: float = 1.0, smoothing: float = 0.0) -> torch.Tensor:
    """Teacher-label temperature then smoothing: q' = σ(logit(q) / T), q'' = (1 − ε)·q' + ε/2.

    T > 1 moves every label towards 1/2 on the logit scale (T < 1 sharpens); ε mixes in the uniform label. Labels of
    exactly 0 or 1 stay 0 or 1 under any T (the limit), never NaN; other logits are clamped to ±`LABEL_LOGIT_RANGE`.
    At T = 1 and ε = 0 the very tensor `q` comes back (bit-identical: no σ(logit(q)) round trip).
    """
    if temperature != 1.0:
        logit = torch.logit(q.float()).clamp(-LABEL_LOGIT_RANGE, LABEL_LOGIT_RANGE)
        tempered = torch.sigmoid(logit / temperature)
        q = torch.where((q == 0) | (q == 1), q.float(), tempered).to(q.dtype)
    if smoothing != 0.0:
        q = (1.0 - smoothing) * q + smoothing / 2.0
    return q


def grm_sft_loss(logp_a: torch.Tensor, logp_b: torch.Tensor, q: torch.Tensor, beta: float) -> torch.Tensor:
    """GRM's SFT regulariser (Yang et al. 2024) under soft labels: mean over pairs of
    q·(−log σ(β·log π(a|x))) + (1 − q)·(−log σ(β·log π(b|x))); with q = 1 (a = chosen) it is −log σ(β·log π(y_c|x)).

    logp_a, logp_b: (B,) log π of each response given its prompt (`grm.sequence_log_probs`).
    """
    q = q.to(logp_a.dtype)  # a side of weight 0 may hold a placeholder log-prob (the caller skips it): 0 · finite
    return -(q * F.logsigmoid(beta * logp_a) + (1 - q) * F.logsigmoid(beta * logp_b)).mean()


def grm_dpo_loss(logp_a: torch.Tensor, logp_b: torch.Tensor, ref_a: torch.Tensor, ref_b: torch.Tensor,
                 q: torch.Tensor, beta: float) -> torch.Tensor:
    """GRM's DPO regulariser under soft labels: BCE-with-logits(β·h, q), h = (log π(a) − log π_ref(a)) −
    (log π(b) − log π_ref(b)); with q = 1 it is DPO's −log σ(β·h). Reference-free DPO passes ref_a = ref_b = 0.
    A reference equal to the student gives h = 0 and log 2 for every q."""
    h = (logp_a - ref_a.to(logp_a.dtype)) - (logp_b - ref_b.to(logp_b.dtype))  # (B,)
    return F.binary_cross_entropy_with_logits(beta * h, q.to(h.dtype))
