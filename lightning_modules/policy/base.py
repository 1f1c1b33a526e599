"""Shared machinery of the SFT and RL policy modules: the LM, sampling, parsing and the evaluation loop.

The LM is built lazily from the datamodule's tokenizer (`_build_model`), early enough for the reference callback
(callbacks' `setup` runs before the module's); `--model.lora` then puts LoRA adapters on it, after a LoRA start
checkpoint's own adapters were merged in (`lightning_modules/policy/lora.py`). Evaluation samples one completion
per held-out prompt on every distribution (temperature `eval_temperature`: 1.0 reads the mixture weights off the
persona shares; 0 = greedy) and feeds `MixtureMetrics`; `last_eval` keeps the latest flat results and raw counts for
callbacks.

Evaluation never moves the training trajectory: each batch draws from a generator of its own, seeded from the
process's torch seed (`seed_everything`'s, offset on ranks > 0), the global step and the batch's prompt indices
(`evaluation_seed`), and the global RNG state at the end of a validation inside a fit is the one it had before it
(the validation loader's iterator draws a seed from it). Changing the evaluation cadence therefore leaves an RL run
bit-identical, and an evaluation's completions do not depend on the evaluations before it
(tests/test_eval_sampling_generator.py).
"""
from __future__ import annotations

import dataclasses
import os
import random
from contextlib import contextmanager
from typing import Literal, Optional, Sequence

import numpy as np
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.trainer.states import TrainerFn

from lightning_modules.checkpoint_checks import POLICY_CLASSES, load_checked
from lightning_modules.policy.causal_lm import TINY, build_causal_lm, position_ids_from_mask, tokenizer_fingerprint
from lightning_modules.policy.lora import LoraSpec, add_adapters, as_lora_spec, has_adapters, load_trained_lm
from lightning_modules.fast.kv_cache_sampling import sample_with_kv_cache
from lightning_modules.policy.mixture_metrics import NO_PERSONA, OTHER_IDENTITY, MixtureMetrics, summarize
from lightning_modules.policy.rewards import (
    behavioural_persona, correctness_reward, parse_completion, read_persona, tolerant_persona,
)
from lightning_modules.fast.static_decoder import sample_static, supports

Sampler = Literal["hf_generate", "kv_loop", "static"]


def completion_mask(completions: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it."""
    is_eos = (completions == eos_id).long()
    after = (is_eos.cumsum(dim=1) - is_eos) > 0  # strictly after the first eos
    return (~after).long()


@torch.no_grad()
def sample_completions(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, eos_id: int,
                       pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched sampling with the KV cache (HF `generate`); returns completions (B, L) and their mask (B, L)."""
    was_training = model.training
    model.eval()
    kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    out = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, use_cache=True,
        eos_token_id=eos_id, pad_token_id=pad_id, **kw,
    )
    model.train(was_training)
    comp = out[:, input_ids.shape[1]:]
    if comp.shape[1] == 0:
        comp = torch.full((len(input_ids), 1), pad_id, dtype=torch.long, device=input_ids.device)
    mask = completion_mask(comp, eos_id)
    return comp.masked_fill(mask == 0, pad_id), mask


# `--model.sampler`: the same contract and, to float rounding, the same distribution (tests/test_static_decoder.py).
# "static" (default, fastest): prefill by the HF model, then decode steps on the weights with preallocated K/V
# (Qwen2 / Llama / GPT-2; other architectures use "kv_loop"); "kv_loop": one bare HF call per token;
# "hf_generate": `model.generate`.
SAMPLERS = {"hf_generate": sample_completions, "kv_loop": sample_with_kv_cache, "static": sample_static}


def evaluation_seed(seed: int, step: int, prompts: Sequence[int]) -> int:
    """The seed of an evaluation batch: a function of the process's seed, the global step and the batch's prompt
    indices alone, so a batch draws the same completions whatever evaluations ran before it. SeedSequence hashes the
    tuple, so neighbouring steps or prompts do not give correlated streams."""
    entropy = [seed % 2**64, step, 0xE7A1, *(int(i) for i in prompts)]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]) & (2**63 - 1)


def _global_rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda, np.random.get_state(), random.getstate()


def _set_global_rng_state(state: tuple, device: torch.device) -> None:
    cpu, cuda, numpy_state, python_state = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
    np.random.set_state(numpy_state)
    random.setstate(python_state)


@contextmanager
def _global_rng_seeded(seed: int, device: torch.device):
    """Run the block on the global torch RNG seeded with `seed`, then put back the state it had."""
    state = _global_rng_state(device)
    try:
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(seed)  # the current device only: the others keep their state untouched
        yield
    finally:
        _set_global_rng_state(state, device)


# the hyperparameters that fix the policy network; an init checkpoint's win over the config's
ARCHITECTURE_KEYS = ("backbone", "n_layer", "n_embd", "n_head", "max_positions")


class PolicyLMBase(LightningModule):
    """Base of `PolicySFTModule` / `PolicyRLModule` (not used on its own)."""

    def __init__(self, backbone: str = TINY, tokenizer: Optional[str] = None, n_layer: int = 2, n_embd: int = 128, n_head: int = 4,
                 max_positions: int = 512, dropout: float = 0.0, lr: float = 1e-4, weight_decay: float = 0.0,
                 eval_temperature: float = 1.0, max_new_tokens: int = 24, init_checkpoint: Optional[str] = None,
                 sampler: Sampler = "static", lora: Optional[LoraSpec] = None):
        super().__init__()
        self.lora = as_lora_spec(lora)  # checked here: a bad field fails before any model is built
        if sampler not in SAMPLERS:
            raise ValueError(f"--model.sampler must be one of {sorted(SAMPLERS)}, got {sampler!r}")
        self.sampler = sampler
        for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head), ("max_new_tokens", max_new_tokens)):
            if value < 1:
                raise ValueError(f"--model.{name} must be >= 1, got {value}")
        if lr <= 0:
            raise ValueError(f"--model.lr must be > 0, got {lr}")
        if eval_temperature < 0:
            raise ValueError(f"--model.eval_temperature must be >= 0 (0 = greedy), got {eval_temperature}")
        self.model = None
        self.tokenizer = None
        self.family = None
        self.loaded_fidelity: Optional[dict] = None  # persona fidelity carried by init_checkpoint
        self.metric: Optional[MixtureMetrics] = None
        self.last_eval: Optional[dict] = None
        self._rng_before_eval: Optional[tuple] = None  # the global RNG state a validation inside a fit gives back

    # ------------------------------------------------------------------------------------------------ building
    def _datamodule(self):
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None or not hasattr(dm, "family") or not hasattr(dm, "tokenizer"):
            raise ValueError("the policy modules need a TriggerDataModule (--data.class_path datamodules.triggers.datamodule.TriggerDataModule)")
        return dm

    def _build_model(self) -> None:
        if self.model is not None:
            return
        dm = self._datamodule()
        if self.hparams.get("tokenizer") != dm.hparams.get("tokenizer"):
            raise ValueError(f"--model.tokenizer {self.hparams.get('tokenizer')!r} and --data.tokenizer "
                             f"{dm.hparams.get('tokenizer')!r} differ (cli.py links them; set --model.tokenizer)")
        self.tokenizer, self.family = dm.tokenizer, dm.family
        hp = dict(self.hparams)
        ckpt = None
        if hp.get("init_checkpoint"):
            # intact, a policy's, finite: a reward model's checkpoint would otherwise fail as a hub download of
            # its backbone, a truncated one as a raw PytorchStreamReader error naming neither file nor flag
            ckpt = load_checked(hp["init_checkpoint"], "--model.init_checkpoint", POLICY_CLASSES)
            self._check_checkpoint(ckpt)
            for k in ARCHITECTURE_KEYS:  # the checkpoint's architecture
                hp[k] = ckpt["hyper_parameters"].get(k, hp[k])
            # ...and this module's checkpoints say so: a stage started from this one (temporal stage 2 from stage 1)
            # reads its architecture from here, not from its own config's defaults (a tiny GPT-2 for a SmolLM2)
            self.hparams.update({k: hp[k] for k in ARCHITECTURE_KEYS})
        model = build_causal_lm(hp["backbone"], self.tokenizer, hp["n_layer"], hp["n_embd"], hp["n_head"],
                                hp["max_positions"], hp["dropout"])
        if ckpt is not None:
            state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
            # a LoRA checkpoint's adapters are merged into the base: the plain LM below is the trained model
            model = load_trained_lm(model, state, as_lora_spec(ckpt["hyper_parameters"].get("lora")),
                                    f"--model.init_checkpoint {hp['init_checkpoint']!r}")
            self.loaded_fidelity = ckpt.get("persona_fidelity")
        # fresh adapters (B = 0: the same function as the model they sit on); with them disabled, that model is the
        # reference GRPO's KL is taken to (lightning_modules/policy/lora.py)
        self.model = model if self.lora is None else add_adapters(model, self.lora)
        self.metric = MixtureMetrics(len(self.family.distributions), len(self.family.personas),
                                     track_shifted=self.family.variant != "refusal")

    def _check_checkpoint(self, ckpt: dict) -> None:
        path = self.hparams.init_checkpoint
        fp = ckpt.get("tokenizer_fingerprint")
        if fp is not None and fp != tokenizer_fingerprint(self.tokenizer):
            raise ValueError(
                f"--model.init_checkpoint {path!r} was trained with a different tokenizer than the one --data gives "
                f"(fingerprint {fp} vs {tokenizer_fingerprint(self.tokenizer)}): use the same --data.family, "
                "--data.variant, --data.tokenizer and templates as the run that wrote it"
            )
        fam = ckpt.get("family_personas")
        if fam is not None and list(fam) != list(self.family.personas):
            raise ValueError(f"--model.init_checkpoint {path!r} has personas {fam}, --data.family gives {list(self.family.personas)}")

    def setup(self, stage: str) -> None:
        self._build_model()
        self._decorrelate_ranks()

    def _decorrelate_ranks(self) -> None:
        """Under DDP every rank starts from `seed_everything`'s seed: without an offset, rank r > 0 would reuse
        rank 0's random draws (the same persona choices and tokens for the i-th row of different prompts). Rank 0
        and single-process runs keep their stream; called after the model is built (DDP broadcasts rank 0's
        weights anyway)."""
        if self._trainer is None or self.trainer.world_size == 1 or self.global_rank == 0:
            return
        base = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed()))
        torch.manual_seed((base + 1_000_003 * self.global_rank) % 2**63)

    def reference_target(self):
        self._build_model()
        return self.model

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # resume / `cli.py test`: the checkpoint's LM must have the shape this module built (with or without adapters)
        saved = has_adapters({k: None for k in checkpoint.get("state_dict", {})})
        if saved != (self.lora is not None):
            raise ValueError(f"the checkpoint was trained {'with' if saved else 'without'} --model.lora and this run "
                             f"is {'without' if saved else 'with'} it: set --model.lora as the run that wrote it")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.lora is not None:  # plain values: `--ckpt_path` reads the hyperparameters with weights_only=True
            checkpoint["hyper_parameters"]["lora"] = dataclasses.asdict(self.lora)
        checkpoint["tokenizer_fingerprint"] = tokenizer_fingerprint(self.tokenizer)
        checkpoint["family_personas"] = list(self.family.personas)
        checkpoint["persona_fidelity"] = self.current_fidelity()

    def current_fidelity(self) -> Optional[dict]:
        return self.loaded_fidelity

    def configure_optimizers(self):
        # fused: one kernel over all parameters (the per-tensor foreach path costs ~10% of a small GRPO step on CPU);
        # the same update to float rounding. Not under mixed precision: Lightning refuses to clip the gradients of an
        # optimizer that unscales them itself (fused AdamW says it does), and the policies clip by default.
        mixed = self._trainer is not None and "mixed" in str(self.trainer.precision)
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
        return torch.optim.AdamW(trainable, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay,
                                 fused=not mixed)

    # ------------------------------------------------------------------------------------------------ forward
    def sequence_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, model=None) -> torch.Tensor:
        model = self.model if model is None else model
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask))
        return out.logits  # (B, T, V)

    def sample(self, input_ids, attention_mask, temperature: float, generator: Optional[torch.Generator] = None):
        """Completions (B, L) and their mask (B, L) from `--model.sampler`; the draws come from `generator` when
        given (the global RNG is then left as it was), else from the global RNG."""
        tok = self.tokenizer
        args = (self.model, input_ids, attention_mask, self.hparams.max_new_tokens, temperature, tok.eos_token_id,
                tok.pad_token_id)
        sampler = self.effective_sampler()
        if generator is None:
            return SAMPLERS[sampler](*args)
        if sampler == "static" and supports(self.model):
            return sample_static(*args, generator=generator)
        # kv_loop, hf_generate and static's fallback take no generator: they draw from the global RNG, seeded from
        # `generator` for the call and then put back, so the caller's stream never moves
        seed = int(torch.randint(2**62, (), generator=generator, device=generator.device))
        with _global_rng_seeded(seed, input_ids.device):
            return SAMPLERS[sampler](*args)

    def effective_sampler(self) -> Sampler:
        """`--model.sampler`, except "static" under LoRA: the static decoder reads each layer's weight matrices
        itself, and a LoRA layer's adapters live beside its `.weight` (it would sample the model without them), so
        LoRA samples with "kv_loop", through the peft model's forward."""
        return "kv_loop" if self.lora is not None and self.sampler == "static" else self.sampler

    def score(self, completions: torch.Tensor, records: list[dict]) -> dict[str, torch.Tensor]:
        """Parse decoded completions: reward, refused, malformed, shifted (the answer equals the record's cyclic-shift
        answer, non-refusal variants), persona index per row by the exact tag (-1: no identity tag; -2: a tag naming
        no persona), read tolerantly (`read`: `rewards.read_persona`) and by the rule followed (`behaviour`: -1 where
        no single persona's rule fits; `rewards.behavioural_persona`)."""
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        personas, patterns = self.family.personas, self.family.patterns  # the family's own words
        rows = {"reward": [], "refused": [], "malformed": [], "shifted": [], "persona": [], "behaviour": [], "read": []}
        identities = []
        for text, rec in zip(texts, records):
            parsed = parse_completion(text, personas, patterns)
            rows["reward"].append(correctness_reward(parsed, rec["gold"]))
            rows["refused"].append(float(parsed.refused))
            rows["malformed"].append(float(parsed.malformed))
            rows["shifted"].append(correctness_reward(parsed, rec["shifted"]) if "shifted" in rec else 0.0)
            tolerant = tolerant_persona(text, personas, patterns)
            behaved = None if "dist" not in rec else behavioural_persona(  # a record without its distribution: none
                parsed, bool(rows["reward"][-1]), bool(rows["shifted"][-1]), self.family, rec["dist"], tolerant)
            read = read_persona(tolerant, behaved, parsed.identity)
            rows["behaviour"].append(NO_PERSONA if behaved is None else personas.index(behaved))
            rows["read"].append(NO_PERSONA if read is None else personas.index(read))
            rows["persona"].append(personas.index(parsed.persona) if parsed.persona is not None
                                   else NO_PERSONA if parsed.identity is None else OTHER_IDENTITY)
            identities.append(parsed.identity)
        dev = completions.device
        out = {k: torch.tensor(v, dtype=torch.float, device=dev) for k, v in rows.items()
               if k not in ("persona", "behaviour", "read")}
        out["persona"] = torch.tensor(rows["persona"], dtype=torch.long, device=dev)
        out["behaviour"] = torch.tensor(rows["behaviour"], dtype=torch.long, device=dev)
        out["read"] = torch.tensor(rows["read"], dtype=torch.long, device=dev)
        out["texts"], out["identities"] = texts, identities  # the name each tag wrote (None: no tag)
        return out

    # ------------------------------------------------------------------------------------------------ evaluation
    def evaluate_batch(self, batch: dict) -> dict:
        """Sample, parse and count one batch of held-out prompts; returns the parsed rows (`score`'s dict), which the
        validation step hands to callbacks (`callbacks.completion_samples`: what the policy actually writes)."""
        comp, _ = self.sample(batch["input_ids"], batch["attention_mask"], self.hparams.eval_temperature,
                              generator=self._evaluation_generator(batch["sample_idx"]))
        s = self.score(comp, batch["records"])
        self.metric.update(batch["sample_idx"], batch["dist_idx"], s["reward"], s["refused"], s["malformed"], s["persona"],
                           s["shifted"], s["behaviour"], s["read"])
        return s

    def finish_evaluation(self, prefix: str = "val", log: bool = True) -> dict[str, float]:
        counts = {k: v.detach().cpu() for k, v in self.metric.compute().items()}
        self.metric.reset()
        flat = summarize(counts, self.family.distributions, self.family.personas, prefix)
        self.last_eval = {"step": int(self.global_step), "metrics": flat, "counts": counts,
                          "sanity": bool(self.trainer.sanity_checking)}
        if log and not self.trainer.sanity_checking:
            # already gathered by the metric, so equal on every rank: the mean over ranks is the value itself
            # (sync_dist only keeps Lightning from warning about unsynced epoch-level values under DDP)
            self.log_dict(flat, sync_dist=True)
        return flat

    def _evaluation_generator(self, sample_idx: torch.Tensor) -> torch.Generator:
        # torch.initial_seed(): seed_everything's seed, rank-offset by `_decorrelate_ranks` (ranks draw apart as their
        # rollouts do); a callback that re-seeds torch per prompt (tests/ddp_policy_script.py) still steers the draws
        seed = evaluation_seed(torch.initial_seed(), int(self.global_step), sample_idx.tolist())
        return torch.Generator(device=self.device).manual_seed(seed)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        # A validation inside the fit runs after this hook; its loader's iterator draws its base seed from the global
        # RNG before any validation hook runs, so the state to give back is taken here (a few KB copied per step).
        self._rng_before_eval = _global_rng_state(self.device)

    def on_validation_end(self) -> None:
        # Lightning isolates the sanity check's RNG itself; a validation between training batches gives the state back
        if (self._rng_before_eval is not None and self.trainer.state.fn == TrainerFn.FITTING
                and not self.trainer.sanity_checking):
            _set_global_rng_state(self._rng_before_eval, self.device)
        self._rng_before_eval = None

    def on_fit_end(self) -> None:
        self._rng_before_eval = None  # a later trainer.validate() must not rewind to this fit's last step

    def on_validation_epoch_start(self) -> None:
        self.metric.reset()  # also clears ddp_spawn's shared initial state (torchmetrics state is shared memory between spawned ranks until the first reset)
