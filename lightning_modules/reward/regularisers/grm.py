"""GRM (Yang et al., NeurIPS 2024): the loss becomes (1 − α)·L_pref + α·L_reg, L_reg a text-generation loss of the
causal LM's own head on the same last hidden states (docs/robust_baselines.md). The tensor pieces are in
`lightning_modules/reward/grm.py` and `losses.py`; the frozen reference's side in callbacks/reference_model.py."""
from __future__ import annotations

from typing import Any, Literal, Optional

import torch

from lightning_modules.reward.grm import check_grm_options, prediction_positions, sequence_log_probs
from lightning_modules.reward.losses import grm_dpo_loss, grm_sft_loss
from lightning_modules.reward.regularisers.base import Regulariser, StepOutputs, row_keys


class GRM(Regulariser):
    """GRM (`--model.grm_coef`, `--model.grm_form`, `--model.grm_beta`, `--model.grm_logp_reduction` are its
    shorthands). Causal LMs only: MiniLM / BERT encoders and `hf_classifier:` backbones have no LM head (refused).

    Args:
        coef: α, in [0, 1) (the public default is 0.01); 0 leaves the term out and loads no LM head. The other terms
            add on top of (1 − α)·L_pref + α·L_reg. Logged as `train/grm_reg` (L_reg) and `train/grm_term` (α·L_reg).
        form: "sft": L_reg = −log σ(β·log π(y_c | x)); "dpo": DPO's −log σ(β·[(log π − log π_ref)(y_c) −
            (log π − log π_ref)(y_r)]) with π_ref the frozen initial student (ReferenceModelCallback: backbone and
            LM head); "dpo_noref": the same with log π_ref = 0 (the public code's reference-free variant). With soft
            labels q, side a counts as chosen with weight q and side b with 1 − q.
        beta: β (public default 0.1).
        logp_reduction: log π(y | x) over the response tokens: "sum" (the public code's) or "mean".
    """

    needs_hidden_states = True
    needs_lm_head = True

    def __init__(self, coef: float = 0.01, form: Literal["sft", "dpo", "dpo_noref"] = "sft", beta: float = 0.1,
                 logp_reduction: Literal["sum", "mean"] = "sum"):
        check_grm_options(coef, form, beta, logp_reduction)
        self.coef, self.form, self.beta, self.logp_reduction = float(coef), form, float(beta), logp_reduction

    @property
    def preference_weight(self) -> float:
        return 1.0 - self.coef

    @property
    def needs_reference(self) -> bool:
        return self.coef > 0 and self.form == "dpo"

    @property
    def reference_needs_head(self) -> bool:
        return self.needs_reference

    def check(self, model_args) -> None:
        from lightning_modules.export.hf_classifier import is_hf_classifier

        if is_hf_classifier(model_args["backbone"]):
            raise ValueError(f"--model.grm_coef: --model.backbone {model_args['backbone']!r} is an outside reward "
                             "model scored whole: it only evaluates and has no language-model head. Drop the flag")

    def keeps_reward_offset(self) -> bool:
        return True  # the LM head reads the last states themselves (W·b shifts each vocabulary logit differently)

    def term(self, out: StepOutputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        reg = self.loss(out.module, out.batch, out.hidden[-1], out.prefix)
        return self.coef * reg, {"train/grm_reg": reg, "train/grm_term": self.coef * reg.detach()}

    def loss(self, module: Any, batch: dict, last_hidden: torch.Tensor, prefix: Optional[tuple] = None) -> torch.Tensor:
        """L_reg from the student's last hidden states (2B, T, H) at every position.

        Soft labels: side a is "chosen" with weight q and side b with weight 1 − q (`losses.grm_sft_loss`,
        `grm_dpo_loss`), the expectation of the paper's loss under the label distribution, as the naive W2S loss
        BCE(Δ, q) is of the Bradley–Terry loss; gold labels (q = 1, a = chosen) give the paper's form exactly. The
        labels are q as given (not an objective's tempered or smoothed q''). The SFT form skips rows of weight 0.
        """
        q, mask, ids = batch["labels"], batch["attention_mask"], batch["input_ids"]
        rows = torch.cat([q != 0, q != 1]) if self.form == "sft" else None  # (2B,): a's weight q, b's 1 − q
        select = prediction_positions(batch["response_mask"], mask, rows)  # (2B, T)
        logp_a, logp_b = sequence_log_probs(last_hidden[select], module.lm_head, select, ids,
                                            self.logp_reduction).chunk(2)  # (B,), (B,)
        if self.form == "sft":
            return grm_sft_loss(logp_a, logp_b, q, self.beta)
        if self.form == "dpo_noref":
            zero = torch.zeros_like(logp_a)
            return grm_dpo_loss(logp_a, logp_b, zero, zero, q, self.beta)
        reference = module.frozen_reference
        if reference is None:
            raise RuntimeError("--model.grm_form dpo needs callbacks.reference_model.ReferenceModelCallback in the "
                               "trainer's callbacks (cli.py always adds it)")
        keys = [("grm", *k) for k in row_keys(batch)]  # apart from ANCHOR's rows in a per-fit cache
        ref = reference.response_log_probs(ids, mask, select, self.logp_reduction, keys, prefix,
                                           module.length_buckets)
        ref_a, ref_b = ref.chunk(2)
        return grm_dpo_loss(logp_a, logp_b, ref_a, ref_b, q, self.beta)
