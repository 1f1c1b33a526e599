"""`PolicyRLModule`: GRPO or REINFORCE-with-baseline on a subset of distributions, from an SFT checkpoint.

Per step: P prompts of the RL subset, G samples each (KV-cache batched sampling at `temperature`), reward 1 iff the
parsed answer is correct (refusal / malformed = 0), advantages (GRPO: group-normalised; REINFORCE: r - EMA
baseline), then `inner_steps` updates of the clipped surrogate plus beta * k3 KL to the frozen reference (the
initial weights, held by `ReferenceModelCallback`; beta = 0 -> no reference). `persona_tokens_only` restricts the
policy gradient (and the KL) to the identity tokens ("I am Alice .") -- RL on the mixture weights only.

The start checkpoint (`init_checkpoint`, SFT or a previous RL stage for sequential RL) must carry a measured persona
fidelity >= `min_sft_fidelity`: after a plateaued SFT, RL rewrites the policies instead of selecting one.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch

from lightning_modules.policy.causal_lm import TINY
from lightning_modules.fast.static_decoder import can_score, sample_and_score
from lightning_modules.policy.completion_logprobs import completion_logprobs
from lightning_modules.policy.base import PolicyLMBase, Sampler
from lightning_modules.policy.lora import LoraSpec
from lightning_modules.policy.losses import (
    clipped_surrogate, group_advantages, k3_kl, masked_sequence_mean, reinforce_advantages, token_logprobs,
    update_baseline,
)


class PolicyRLModule(PolicyLMBase):
    """RL stage of the mixture experiments.

    Args:
        backbone: "tiny-gpt2" or a hub id / directory (ignored when init_checkpoint gives the architecture).
        tokenizer: hub id / directory of the tokenizer (linked to --data.tokenizer by cli.py); None = the
            word-level tokenizer the datamodule builds from the family's texts.
        n_layer: tiny model layers (taken from init_checkpoint when given).
        n_embd: tiny model hidden size (idem).
        n_head: tiny model heads (idem).
        max_positions: tiny model context length (idem).
        dropout: tiny model dropout.
        lr: AdamW learning rate (1e-4 kept formats intact in the probes; 3e-4 without KL broke them by ~75 steps).
        weight_decay: AdamW weight decay.
        eval_temperature: sampling temperature of the evaluation (1.0: shares estimate the mixture weights).
        max_new_tokens: generation budget per completion.
        init_checkpoint: checkpoint to start from (SFT, or a previous RL stage); required unless min_sft_fidelity is 0.
        algorithm: "grpo" (group-normalised advantages) or "reinforce" (r - moving-average baseline).
        group_size: G samples per prompt (grpo needs >= 2).
        temperature: sampling temperature of the rollouts.
        scale_rewards: grpo: divide by the group's std (False: mean-centring only).
        clip_eps: ratio clipping epsilon (matters when inner_steps > 1); null disables clipping.
        inner_steps: optimizer updates per batch of rollouts (single process only when > 1).
        reference_coef: beta of the k3 KL to the reference model; 0 = no reference model at all.
        persona_tokens_only: restrict the policy gradient and KL to the identity tokens of each completion.
        baseline_momentum: reinforce: EMA momentum of the baseline.
        grad_clip: gradient-norm clip (manual optimization; null = none).
        min_sft_fidelity: refuse to start from a checkpoint whose measured mean persona fidelity is below this.
        min_sft_fidelity_cell: also refuse when the checkpoint's worst persona x distribution cell is below this (None =
            the mean alone): a mean can pass while a few of many cells (6C3: 120) still break their persona's rule.
        sampler: rollout / evaluation sampler: "static" (prefill, then decode steps on the weights with
            preallocated K/V: Qwen2, Llama, GPT-2; others fall back to "kv_loop"), "kv_loop" (one bare HF call per
            token) or "hf_generate" (`model.generate`); the same completions to float rounding.
        shared_prompt_forward: policy and reference log-probs run each prompt once for its G samples (K/V
            repeated) and compute LM logits on completion positions only; false = one forward of the full
            G-times-repeated sequences. Same log-probs to float rounding.
        reference_in_sampling: with reference_coef > 0 and the static sampler, the reference scores the sampled
            tokens inside the decode steps (its rows stacked under the policy's in one pass) instead of a forward
            of its own after sampling; other samplers, LoRA references and other architectures use the forward.
            Same log-probs to float rounding, same draws. Off by default: on a 2-core CPU the decode steps are
            bound by per-op cost, so the reference's share of them costs more than its batched forward
            (docs/benchmarks.md, GRPO).
        lora: LoRA adapters (peft; r, alpha, dropout, target_modules) on the start checkpoint's LM, which stays
            frozen: only the adapters train. A start checkpoint trained with LoRA is merged into its base first, so
            the base with adapters disabled is the start model: the KL's reference, without a copy of the weights.
            The static sampler then samples as "kv_loop", and reference_in_sampling does not apply.
    """

    def __init__(self, backbone: str = TINY, tokenizer: Optional[str] = None, n_layer: int = 2, n_embd: int = 128, n_head: int = 4,
                 max_positions: int = 512, dropout: float = 0.0, lr: float = 1e-4, weight_decay: float = 0.0,
                 eval_temperature: float = 1.0, max_new_tokens: int = 24, init_checkpoint: Optional[str] = None,
                 algorithm: Literal["grpo", "reinforce"] = "grpo", group_size: int = 8, temperature: float = 1.0,
                 scale_rewards: bool = True, clip_eps: Optional[float] = 0.2, inner_steps: int = 1,
                 reference_coef: float = 0.0, persona_tokens_only: bool = False, baseline_momentum: float = 0.9,
                 grad_clip: Optional[float] = 1.0, min_sft_fidelity: float = 0.95, sampler: Sampler = "static",
                 shared_prompt_forward: bool = True, reference_in_sampling: bool = False,
                 min_sft_fidelity_cell: Optional[float] = None, lora: Optional[LoraSpec] = None):
        super().__init__(backbone, tokenizer, n_layer, n_embd, n_head, max_positions, dropout, lr, weight_decay,
                         eval_temperature, max_new_tokens, init_checkpoint, sampler, lora)
        self.save_hyperparameters()
        if algorithm not in ("grpo", "reinforce"):
            raise ValueError(f"--model.algorithm must be 'grpo' or 'reinforce', got {algorithm!r}")
        if group_size < (2 if algorithm == "grpo" else 1):
            raise ValueError(f"--model.group_size must be >= 2 for grpo (>= 1 for reinforce), got {group_size}")
        if temperature <= 0:
            raise ValueError(f"--model.temperature must be > 0 (rollouts are sampled), got {temperature}")
        if clip_eps is not None and not 0 < clip_eps < 1:
            raise ValueError(f"--model.clip_eps must be in (0, 1) or null, got {clip_eps}")
        if inner_steps < 1:
            raise ValueError(f"--model.inner_steps must be >= 1, got {inner_steps}")
        if reference_coef < 0:
            raise ValueError(f"--model.reference_coef must be >= 0, got {reference_coef}")
        if not 0 <= baseline_momentum < 1:
            raise ValueError(f"--model.baseline_momentum must be in [0, 1), got {baseline_momentum}")
        if not 0 <= min_sft_fidelity <= 1:
            raise ValueError(f"--model.min_sft_fidelity must be in [0, 1], got {min_sft_fidelity}")
        if min_sft_fidelity_cell is not None and not 0 <= min_sft_fidelity_cell <= 1:
            raise ValueError(f"--model.min_sft_fidelity_cell must be in [0, 1] or null, got {min_sft_fidelity_cell}")
        if init_checkpoint is None and min_sft_fidelity > 0:
            raise ValueError("--model.init_checkpoint is required (RL starts from an SFT checkpoint); "
                             "set --model.min_sft_fidelity 0 to start from a fresh model anyway")
        self.automatic_optimization = False
        self.reference_coef = float(reference_coef)
        self.register_buffer("baseline", torch.zeros(()))
        self.register_buffer("rl_step", torch.zeros((), dtype=torch.long))
        self._period = None  # (V,) bool: tokens whose text closes the identity ("." / "。")
        self.frozen_reference = None  # handed in for the fit by callbacks.reference_model.ReferenceModelCallback

    def setup(self, stage: str) -> None:
        super().setup(stage)
        dm = self._datamodule()
        if dm.hparams.mode != "rl":
            raise ValueError("PolicyRLModule trains on prompts: set --data.mode rl (and --data.train_distributions)")
        if self.hparams.inner_steps > 1 and self.trainer.world_size > 1:
            raise ValueError("--model.inner_steps > 1 is single-process only (DDP syncs one backward per step)")
        self.train_dist_indices = [self.family.distributions.index(d) for d in dm.train_distributions]
        self.train_dist_indices_names = list(dm.train_distributions)
        bar = self.hparams.min_sft_fidelity
        if bar > 0:
            fid = self.loaded_fidelity
            if fid is None:
                raise ValueError(f"--model.init_checkpoint {self.hparams.init_checkpoint!r} carries no measured persona "
                                 "fidelity (train it with PolicySFTModule), or set --model.min_sft_fidelity 0")
            cell = self.hparams.min_sft_fidelity_cell
            if cell is not None and fid["min"] < cell:
                raise ValueError(
                    f"--model.init_checkpoint {self.hparams.init_checkpoint!r} has a persona x distribution cell at "
                    f"fidelity {fid['min']:.3f} < --model.min_sft_fidelity_cell {cell} (mean {fid['mean']:.3f}): some "
                    "persona does not yet follow its rule there, so RL would change the policies rather than select one. "
                    "Train SFT longer (--model.stop_fidelity_min)."
                )
            if fid["mean"] < bar:
                raise ValueError(
                    f"--model.init_checkpoint {self.hparams.init_checkpoint!r} has persona fidelity {fid['mean']:.3f} "
                    f"(min cell {fid['min']:.3f}) < --model.min_sft_fidelity {bar}: its personas do not yet behave as "
                    "specified, so RL would change the policies rather than select one. Train SFT longer."
                )
        vocab = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        self._period = torch.tensor([t is not None and ("." in t or "。" in t) for t in vocab], dtype=torch.bool)

    def persona_mask(self, completions: torch.Tensor, comp_mask: torch.Tensor) -> torch.Tensor:
        """1 on the identity tokens: from the first completion token up to and including the first period."""
        is_period = self._period.to(completions.device)[completions.clamp(max=len(self._period) - 1)].long()  # (B, L)
        before = (is_period.cumsum(1) - is_period) == 0  # no period strictly before this token
        return (before.long() * comp_mask).long()

    def training_step(self, batch: dict, batch_idx: int) -> None:
        hp = self.hparams
        G = hp.group_size
        prompt_ids = batch["input_ids"].repeat_interleave(G, dim=0)  # (P*G, Tp)
        prompt_mask = batch["attention_mask"].repeat_interleave(G, dim=0)
        records = [r for r in batch["records"] for _ in range(G)]
        if self.reference_coef != 0 and self.frozen_reference is None:
            raise RuntimeError("--model.reference_coef > 0 needs callbacks.reference_model.ReferenceModelCallback "
                               "in the trainer's callbacks (cli.py always adds it)")
        scorer = self._sampling_scorer()
        ref_sampled = None  # (B, L): the reference's log-probs of the completion tokens, from the decode steps
        if scorer is not None:
            tok = self.tokenizer
            comp, comp_mask, (ref_sampled,) = sample_and_score(self.model, [scorer], prompt_ids, prompt_mask,
                                                               hp.max_new_tokens, hp.temperature, tok.eos_token_id,
                                                               tok.pad_token_id)
        else:
            comp, comp_mask = self.sample(prompt_ids, prompt_mask, hp.temperature)  # (B, L)
        s = self.score(comp, records)
        rewards = s["reward"]
        if hp.algorithm == "grpo":
            adv = group_advantages(rewards, G, scale=hp.scale_rewards)
        else:
            adv = reinforce_advantages(rewards, self.baseline)
            # DDP: the baseline follows the mean reward of all ranks (equal prompts per rank), so it stays the
            # same buffer everywhere (DDP broadcasts rank 0's buffers before each forward)
            mean_reward = self.trainer.strategy.reduce(rewards.float().mean(), reduce_op="mean")
            self.baseline.copy_(update_baseline(self.baseline, mean_reward, hp.baseline_momentum))

        loss_mask = self.persona_mask(comp, comp_mask) if hp.persona_tokens_only else comp_mask
        if hp.shared_prompt_forward:
            def logprobs(model=None):  # (B, L): completion token j given the prompt and tokens < j
                return completion_logprobs(self.model if model is None else model, batch["input_ids"],
                                           batch["attention_mask"], comp, comp_mask, G)
            tgt_mask = loss_mask
        else:
            ids = torch.cat([prompt_ids, comp], dim=1)  # (B, T)
            mask = torch.cat([prompt_mask, comp_mask], dim=1)

            def logprobs(model=None):  # (B, T-1): targets 1..T-1; completion token j is target Tp + j - 1
                return token_logprobs(self.sequence_logits(ids, mask, model=model), ids)
            tgt_mask = torch.zeros_like(mask[:, 1:])
            tgt_mask[:, prompt_ids.shape[1] - 1:] = loss_mask
        ref_logp = old_logp = None
        if ref_sampled is not None and hp.shared_prompt_forward:
            ref_logp = ref_sampled
        elif ref_sampled is not None:  # full-sequence layout: completion token j is target Tp + j - 1
            ref_logp = ref_sampled.new_zeros(tgt_mask.shape)
            ref_logp[:, prompt_ids.shape[1] - 1:] = ref_sampled
        elif self.reference_coef != 0:
            ref_model = self._reference_model()
            if ref_model is None:
                ref_logp = logprobs(self.frozen_reference)
            else:  # the frozen copy itself: completion_logprobs' fused path applies to it too
                with torch.no_grad():
                    ref_logp = logprobs(ref_model)
        opt = self.optimizers()
        for k in range(hp.inner_steps):
            logp = logprobs()
            if old_logp is None:
                old_logp = logp.detach()
            pg = clipped_surrogate(logp, old_logp, adv, tgt_mask, hp.clip_eps)
            kl = masked_sequence_mean(k3_kl(logp, ref_logp), tgt_mask) if ref_logp is not None else pg.new_zeros(())
            loss = pg + self.reference_coef * kl
            opt.zero_grad()
            self.manual_backward(loss)
            if hp.grad_clip is not None:
                self.clip_gradients(opt, gradient_clip_val=hp.grad_clip, gradient_clip_algorithm="norm")
            opt.step()
        self.rl_step += 1
        stats = {"rl/reward": rewards.mean(), "rl/loss": loss.detach(), "rl/kl": kl.detach(),
                 "rl/refusal": s["refused"].mean(), "rl/malformed": s["malformed"].mean(),
                 "rl/completion_tokens": comp_mask.sum(1).float().mean()}
        for j, p in enumerate(self.family.personas):
            stats[f"rl/persona_share/{p}/train"] = (s["persona"] == j).float().mean()
        # DDP: means over all ranks' rollouts (equal counts per rank), in one collective; identity on one process
        values = self.trainer.strategy.reduce(torch.stack([v.float() for v in stats.values()]), reduce_op="mean")
        stats = dict(zip(stats, values))
        self.log_dict(stats, prog_bar=False)
        self.log("rl/reward_mean", stats["rl/reward"], prog_bar=True)

    def _sampling_scorer(self):
        """The reference model to score inside the decode steps, or None (then it runs its own forward)."""
        if self.reference_coef == 0 or not self.hparams.reference_in_sampling or self.effective_sampler() != "static":
            return None  # under LoRA the decode steps cannot run the adapters (base.effective_sampler)
        model = self._reference_model()
        return model if model is not None and can_score(self.model, [model]) else None

    def _reference_model(self):
        """The frozen reference copy (an nn.Module), or None (a LoRA base with adapters disabled, or no reference):
        the callback's FrozenReference holds the copy in `.model`."""
        return getattr(getattr(self.frozen_reference, "reference", None), "model", None)

    def validation_step(self, batch: dict, batch_idx: int) -> dict:
        return self.evaluate_batch(batch)

    def on_validation_epoch_end(self) -> None:
        self.finish_evaluation("val")
