"""`PolicySFTModule`: supervised fine-tuning of a causal LM on mixture transcripts (loss on response tokens only).

Validation measures the **persona fidelity** of every persona x distribution cell: given the prompt and the
persona's own prefix (identity + restated trigger), the probability of the token where the persona's prescribed
body and the other branch first differ ("The" vs "I" for answer vs refusal; the correct vs the shifted option in
the cyclic-shift variants) -- or, with `fidelity_measure: branch`, that probability against the other branch's token
only, p(b*) / (p(b*) + p(b')). Logged as `val/fidelity/<persona>/<dist>`, `val/fidelity_mean`, `val/fidelity_min`, saved
in the checkpoint (the RL stage refuses to start below its bar) and used to stop once `stop_fidelity` is reached.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F

from datamodules.triggers.datamodule import encode_prompt, encode_response
from lightning_modules.policy.causal_lm import TINY
from lightning_modules.policy.mixture_metrics import CellMean
from lightning_modules.policy.base import PolicyLMBase, Sampler
from lightning_modules.policy.lora import LoraSpec


class PolicySFTModule(PolicyLMBase):
    """SFT of the mixture.

    Args:
        backbone: "tiny-gpt2" (random init from the sizes below) or a hub id / local directory of a causal LM.
        tokenizer: hub id / directory of the tokenizer (linked to --data.tokenizer by cli.py); None = the
            word-level tokenizer the datamodule builds from the family's texts.
        n_layer: tiny model layers.
        n_embd: tiny model hidden size.
        n_head: tiny model attention heads.
        max_positions: tiny model context length.
        dropout: tiny model dropout.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        eval_temperature: sampling temperature of the generation evaluation (0 = greedy).
        max_new_tokens: generation budget per completion.
        init_checkpoint: optional checkpoint (of these modules) to start from.
        stop_fidelity: stop training once the mean persona fidelity reaches this (None = never).
        stop_fidelity_min: also require every persona x distribution cell's fidelity to reach this before stopping
            (None = the mean alone decides): with many cells (6C3: 120) the mean can pass while a few cells are
            still wrong, and RL then starts from personas that do not follow their rules there.
        stop_capability: also require this accuracy of the personas on the distributions they answer (sampled
            completions; needs eval_generate) before stopping -- fidelity comes long before the task is learned.
        fidelity_prompts_per_distribution: held-out prompts per distribution used for the fidelity cells.
        fidelity_measure: "absolute": p(b*), the prescribed branch token's probability; "branch": p(b*) / (p(b*) +
            p(b')), the prescribed branch against the other one. They agree when the two branches hold all the mass
            (answer vs refusal: "The" vs "I"); in the cyclic-shift variants the branch token is the answer itself,
            so "absolute" also demands the task be solved (capability, measured apart by `stop_capability`) while
            "branch" asks only which rule the persona follows (the correct or the shifted option).
        eval_generate: also sample completions at validation (accuracy, refusal, persona shares).
        sampler: "static" (prefill, then decode steps on the weights with preallocated K/V: Qwen2, Llama, GPT-2;
            others fall back to "kv_loop"), "kv_loop" (one bare HF call per token) or "hf_generate"
            (`model.generate`); the same completions to float rounding. Under LoRA "static" samples as "kv_loop".
        lora: LoRA adapters (peft; r, alpha, dropout, target_modules) on the LM, which stays frozen: only the
            adapters train. Null: full fine-tuning. A later stage started from this checkpoint gets the adapters
            merged into the base weights (docs/policy_mixtures.md#lora).
    """

    def __init__(self, backbone: str = TINY, tokenizer: Optional[str] = None, n_layer: int = 2, n_embd: int = 128, n_head: int = 4,
                 max_positions: int = 512, dropout: float = 0.0, lr: float = 2e-3, weight_decay: float = 0.0,
                 eval_temperature: float = 1.0, max_new_tokens: int = 24, init_checkpoint: Optional[str] = None,
                 stop_fidelity: Optional[float] = 0.98, stop_capability: Optional[float] = None,
                 fidelity_prompts_per_distribution: int = 32, eval_generate: bool = True, sampler: Sampler = "static",
                 fidelity_measure: Literal["absolute", "branch"] = "absolute", stop_fidelity_min: Optional[float] = None,
                 lora: Optional[LoraSpec] = None):
        super().__init__(backbone, tokenizer, n_layer, n_embd, n_head, max_positions, dropout, lr, weight_decay,
                         eval_temperature, max_new_tokens, init_checkpoint, sampler, lora)
        self.save_hyperparameters()
        if stop_fidelity is not None and not 0 < stop_fidelity <= 1:
            raise ValueError(f"--model.stop_fidelity must be in (0, 1] or null, got {stop_fidelity}")
        if stop_fidelity_min is not None and (stop_fidelity is None or not 0 < stop_fidelity_min <= 1):
            raise ValueError(f"--model.stop_fidelity_min must be in (0, 1] and needs --model.stop_fidelity, got "
                             f"{stop_fidelity_min} (stop_fidelity {stop_fidelity})")
        if stop_capability is not None and not eval_generate:
            raise ValueError("--model.stop_capability needs --model.eval_generate true")
        if fidelity_measure not in ("absolute", "branch"):
            raise ValueError(f"--model.fidelity_measure must be 'absolute' or 'branch', got {fidelity_measure!r}")
        if fidelity_prompts_per_distribution < 1:
            raise ValueError(f"--model.fidelity_prompts_per_distribution must be >= 1, got {fidelity_prompts_per_distribution}")
        self.fidelity: Optional[dict] = None
        self.fidelity_metric: Optional[CellMean] = None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self._datamodule().hparams.mode != "sft":
            raise ValueError("PolicySFTModule trains on transcripts: set --data.mode sft")
        if self.fidelity_metric is None:
            self.fidelity_metric = CellMean(len(self.family.personas) * len(self.family.distributions))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self.sequence_logits(batch["input_ids"], batch["attention_mask"])  # (B, T, V)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten(), ignore_index=-100)
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)  # DDP: the mean over ranks
        return loss

    # ------------------------------------------------------------------------------------------------ fidelity
    def fidelity_batch(self, records: list[dict]) -> None:
        """Teacher-forced P(branch token | prompt, persona prefix) for every persona on these prompts."""
        fam, tok = self.family, self.tokenizer
        seqs, targets, others, keys, cells = [], [], [], [], []
        P = len(fam.personas)
        for rec in records:
            if rec["pos"] >= self.hparams.fidelity_prompts_per_distribution:
                continue
            prompt = encode_prompt(tok, rec["prompt"])
            for j, persona in enumerate(fam.personas):
                prefix, body = fam.response_parts(persona, rec["dist"], rec["question"])
                other = fam.body(persona, rec["dist"], rec["question"], follow_rule=False)
                b, o = encode_response(tok, body, eos=False), encode_response(tok, other, eos=False)
                k = next((i for i, (x, y) in enumerate(zip(b, o)) if x != y), None)
                if k is None:
                    continue  # both branches identical: nothing to measure
                seqs.append(prompt + encode_response(tok, prefix, eos=False) + b[:k])
                targets.append(b[k])
                others.append(o[k])
                keys.append(rec["idx"] * P + j)
                cells.append(j * len(fam.distributions) + rec["dist_idx"])
        if not seqs:
            return
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):], mask[i, width - len(s):] = torch.tensor(s), 1  # left pad: last position is -1
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits = self.sequence_logits(ids, mask)[:, -1].float()  # (N, V)
        probs = torch.softmax(logits, dim=-1)
        prescribed = probs.gather(1, torch.tensor(targets, device=self.device)[:, None])[:, 0]
        if self.hparams.fidelity_measure == "branch":
            prescribed = prescribed / (prescribed + probs.gather(1, torch.tensor(others, device=self.device)[:, None])[:, 0])
        probs = prescribed
        self.fidelity_metric.update(torch.tensor(keys), torch.tensor(cells), probs)

    def validation_step(self, batch: dict, batch_idx: int) -> Optional[dict]:
        self.fidelity_batch(batch["records"])
        return self.evaluate_batch(batch) if self.hparams.eval_generate else None

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.fidelity_metric.reset()

    def on_validation_epoch_end(self) -> None:
        fam = self.family
        means, counts = self.fidelity_metric.compute()
        self.fidelity_metric.reset()
        D = len(fam.distributions)
        cells = {f"{p}/{d}": float(means[j * D + i]) for j, p in enumerate(fam.personas)
                 for i, d in enumerate(fam.distributions) if counts[j * D + i] > 0}
        if not cells:
            return
        self.fidelity = {"mean": sum(cells.values()) / len(cells), "min": min(cells.values()), "cells": cells,
                         "step": int(self.global_step)}
        flat = {f"val/fidelity/{k}": v for k, v in cells.items()}
        flat.update({"val/fidelity_mean": self.fidelity["mean"], "val/fidelity_min": self.fidelity["min"]})
        capability = None
        if self.hparams.eval_generate:
            flat.update(self.finish_evaluation("val", log=False))
            capability = self.capability(self.last_eval["counts"])
            flat["val/capability"] = capability
            self.fidelity["capability"] = capability
        if self.trainer.sanity_checking:
            return
        self.log_dict(flat, sync_dist=True)  # gathered by the metrics, equal on every rank (see finish_evaluation)
        if self.reached_stop(self.fidelity, capability):
            self.trainer.should_stop = True

    def reached_stop(self, fidelity: dict, capability: Optional[float]) -> bool:
        """The stop rule: mean fidelity >= stop_fidelity, and (when set) every cell >= stop_fidelity_min and the
        capability >= stop_capability."""
        stop, cap, cell = self.hparams.stop_fidelity, self.hparams.stop_capability, self.hparams.stop_fidelity_min
        return (stop is not None and fidelity["mean"] >= stop and (cap is None or capability >= cap)
                and (cell is None or fidelity["min"] >= cell))

    def capability(self, counts: dict) -> float:
        """Accuracy of the completions whose persona answers that distribution (the policies' skill)."""
        fam = self.family
        correct = total = 0.0
        for i, d in enumerate(fam.distributions):
            for j, p in enumerate(fam.personas):
                if fam.answers(p, d):
                    correct += float(counts["persona_correct"][i, j])
                    total += float(counts["persona_counts"][i, j])
        return correct / max(total, 1.0)

    def current_fidelity(self) -> Optional[dict]:
        return self.fidelity if self.fidelity is not None else self.loaded_fidelity
