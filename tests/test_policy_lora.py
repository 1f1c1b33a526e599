"""LoRA for the policies (`--model.lora`): only adapters train, the chain SFT -> RL merges the start checkpoint's
adapters, the KL's reference is the start model with adapters disabled (no copy), checkpoints load back, export
merges, and bad input fails naming the flag. Tiny random-init GPT-2 / Qwen2 models."""
import copy
import os
import re

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_modules.policy.rl as rl_module
from callbacks.reference_model import ReferenceModelCallback
from datamodules.triggers.datamodule import TriggerDataModule, encode_prompt, left_pad
from lightning_modules.policy.completion_logprobs import completion_logprobs
from lightning_modules.policy.losses import k3_kl, masked_sequence_mean, token_logprobs
from lightning_modules.policy.lora import add_adapters, trainable_parameters
from lightning_modules.policy.rl import PolicyRLModule
from lightning_modules.policy.sft import PolicySFTModule
from lightning_modules.reward.backbones import LoraSpec
from mixture_fixtures import ROOT

TINY = dict(n_layer=1, n_embd=32, n_head=2, max_positions=64)
LORA = dict(r=4, alpha=8)
# all-linear on a 1-layer GPT-2 of width 32 (lm_head excluded by peft): r * (in + out) per adapted matrix,
# c_attn 32->96, attn.c_proj 32->32, mlp.c_fc 32->128, mlp.c_proj 128->32
ADAPTER_PARAMS = 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))


def _trainer(steps, **kw):
    kw.setdefault("num_sanity_val_steps", 0)
    kw.setdefault("limit_val_batches", 0)
    kw.setdefault("enable_checkpointing", False)
    return L.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     accelerator="cpu", devices=1, **kw)


def _sft_dm(cache_dir):
    return TriggerDataModule(family="two_policies", num_train=32, batch_size=16, num_val_per_distribution=2,
                             cache_dir=cache_dir)


def _rl_dm(cache_dir):
    return TriggerDataModule(family="two_policies", mode="rl", train_distributions=["A"], num_train=8, batch_size=2,
                             num_val_per_distribution=3, val_batch_size=4, cache_dir=cache_dir)


def _sft_ckpt(tmp_path, cache_dir, lora, name="sft.ckpt"):
    """A 1-step SFT checkpoint whose trained part is perturbed: its adapters (or weights) then matter, so a chain
    that dropped them would give other log-probs."""
    torch.manual_seed(0)
    m = PolicySFTModule(lora=lora, stop_fidelity=None, eval_generate=False, **TINY)
    t = _trainer(1)
    t.fit(m, _sft_dm(cache_dir))
    with torch.no_grad():
        for p in m.model.parameters():
            if p.requires_grad:
                p.add_(0.5 * torch.randn_like(p))
    m.fidelity = {"mean": 1.0, "min": 1.0, "cells": {}, "step": 1}
    path = str(tmp_path / name)
    t.save_checkpoint(path)
    return path, m


def _prompts_and_completions(dm, n_prompts=3, group=2, length=5, seed=1):
    dm.setup("validate")
    tok = dm.tokenizer
    ids, mask = left_pad([encode_prompt(tok, it["prompt"]) for it in dm.val_items[:n_prompts]], tok.pad_token_id)
    g = torch.Generator().manual_seed(seed)
    comp = torch.randint(4, len(tok), (n_prompts * group, length), generator=g)
    return ids, mask, comp, torch.ones_like(comp)


# ---- what trains --------------------------------------------------------------------------------------------------
def test_only_the_adapters_train_and_the_base_stays(cache_dir):
    torch.manual_seed(0)
    m = PolicySFTModule(lora=LoraSpec(**LORA), stop_fidelity=None, eval_generate=False, lr=1e-2, **TINY)
    t = _trainer(3)
    t.fit(m, _sft_dm(cache_dir))
    named = dict(m.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert trainable_parameters(m.model) == ADAPTER_PARAMS == 2048
    opt = t.optimizers[0]
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == ADAPTER_PARAMS  # no frozen tensor in it
    # B starts at zero and moved; the base weights are those of a fresh build from the same seed
    assert all(named[n].abs().sum() > 0 for n in trainable if ".lora_B." in n)
    torch.manual_seed(0)
    fresh = PolicySFTModule(lora=LoraSpec(**LORA), stop_fidelity=None, eval_generate=False, **TINY)
    _trainer(0).fit(fresh, _sft_dm(cache_dir))
    for n, p in fresh.model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, named[n]), n


def test_lora_samples_through_the_adapters(cache_dir, tmp_path):
    # the static decoder reads GPT-2's weight matrices itself and accepts the peft model (the premise): under LoRA
    # the policy samples with kv_loop, which runs the adapters. Greedy completions equal the merged model's.
    from lightning_modules.fast.kv_cache_sampling import sample_with_kv_cache
    from lightning_modules.fast.static_decoder import supports

    _, m = _sft_ckpt(tmp_path, cache_dir, LORA)
    assert supports(m.model) and m.sampler == "static" and m.effective_sampler() == "kv_loop"
    ids, mask, _, _ = _prompts_and_completions(_sft_dm(cache_dir), n_prompts=4)
    tok = m.tokenizer
    ours, _ = m.sample(ids, mask, 0.0)
    merged = copy.deepcopy(m.model).merge_and_unload()
    want, _ = sample_with_kv_cache(merged, ids, mask, m.hparams.max_new_tokens, 0.0, tok.eos_token_id, tok.pad_token_id)
    assert torch.equal(ours, want)
    with m.model.disable_adapter():
        base, _ = m.sample(ids, mask, 0.0)
    assert not torch.equal(base, want)  # the adapters change the completions: the equality above checks something


def test_completion_logprobs_of_a_lora_qwen2_run_the_adapters():
    # completion_logprobs' fused Qwen2 / Llama path reads the weights itself; a peft model must not take it
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = add_adapters(Qwen2ForCausalLM(cfg), LoraSpec(**LORA))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_()
    P, G, Tp, L_ = 2, 3, 4, 5
    prompt = torch.randint(1, 40, (P, Tp))
    comp = torch.randint(1, 40, (P * G, L_))
    got = completion_logprobs(model, prompt, torch.ones_like(prompt), comp, torch.ones_like(comp), G)
    ids = torch.cat([prompt.repeat_interleave(G, 0), comp], 1)
    want = token_logprobs(model(input_ids=ids).logits, ids)[:, Tp - 1:]  # (B, L): the full forward, adapters on
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with model.disable_adapter():
        off = token_logprobs(model(input_ids=ids).logits, ids)[:, Tp - 1:]
    assert (off - want).abs().max() > 0.1


# ---- the chain and the reference -------------------------------------------------------------------------------
class _Record(L.Callback):
    def on_fit_start(self, trainer, pl_module):
        ref = pl_module.frozen_reference.reference
        self.mode, self.extra = ref.mode, ref.parameter_count()


def _loaded_sft(path, cache_dir, lora):
    """The SFT checkpoint loaded as it was trained (a separate model: adapters on, not merged)."""
    m = PolicySFTModule(lora=lora, stop_fidelity=None, eval_generate=False, **TINY)
    _trainer(0).fit(m, _sft_dm(cache_dir))  # builds the LM
    m.load_state_dict(torch.load(path, weights_only=False)["state_dict"])
    return m.model.eval()


@pytest.mark.parametrize("sft_lora", [LORA, None], ids=["lora_sft", "full_sft"])
def test_the_reference_with_adapters_off_is_the_sft_model(tmp_path, cache_dir, sft_lora):
    path, _ = _sft_ckpt(tmp_path, cache_dir, sft_lora)
    sft = _loaded_sft(path, cache_dir, sft_lora)
    rl = PolicyRLModule(init_checkpoint=path, lora=LORA, reference_coef=0.1, group_size=2, max_new_tokens=4, **TINY)
    ref_cb, rec = ReferenceModelCallback(), _Record()
    _trainer(0, callbacks=[ref_cb, rec]).fit(rl, _rl_dm(cache_dir))
    assert (rec.mode, rec.extra) == ("disable_adapter", 0)  # no second copy of the weights
    assert trainable_parameters(rl.model) == ADAPTER_PARAMS
    ids, mask, comp, cmask = _prompts_and_completions(_rl_dm(cache_dir))
    want = completion_logprobs(sft, ids, mask, comp, cmask, 2)  # (B, L)
    ref_cb.setup(None, rl, "fit")  # the callback let go of it at teardown; take it again (adapters still fresh)
    got = completion_logprobs(ref_cb, ids, mask, comp, cmask, 2)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)  # the merge's float rounding only
    with torch.no_grad():
        policy = completion_logprobs(rl.model, ids, mask, comp, cmask, 2)
    assert torch.equal(policy, got)  # fresh adapters (B = 0): the policy starts exactly at its reference
    if sft_lora is not None:  # the SFT adapter matters: dropping it in the chain would fail the equality above
        with torch.no_grad(), sft.disable_adapter():
            assert (completion_logprobs(sft, ids, mask, comp, cmask, 2) - want).abs().max() > 0.05


@pytest.mark.parametrize("shared_prompt_forward", [True, False])
def test_grpo_kl_under_lora_is_the_kl_to_a_frozen_sft_model(tmp_path, cache_dir, monkeypatch, shared_prompt_forward):
    path, _ = _sft_ckpt(tmp_path, cache_dir, LORA)
    sft = _loaded_sft(path, cache_dir, LORA)
    calls = []
    real_k3 = rl_module.k3_kl

    def recording_k3(logp, ref_logp):
        calls.append((logp.detach().clone(), ref_logp.clone()))
        return real_k3(logp, ref_logp)

    seen = {}
    real_score = PolicyRLModule.score

    def recording_score(self, comp, records):  # rewards 1, 0 in each group: advantages that move the adapters
        seen["comp"] = comp.clone()
        out = real_score(self, comp, records)
        out["reward"] = torch.tensor([1.0, 0.0] * (len(comp) // 2))
        return out

    monkeypatch.setattr(rl_module, "k3_kl", recording_k3)
    monkeypatch.setattr(PolicyRLModule, "score", recording_score)
    rl = PolicyRLModule(init_checkpoint=path, lora=LORA, reference_coef=0.4, group_size=2, max_new_tokens=4,
                        inner_steps=2, lr=5e-2, shared_prompt_forward=shared_prompt_forward,
                        reference_in_sampling=True, **TINY)  # reference_in_sampling: not under LoRA (the forward)

    class Batch(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen["batch"] = batch

    t = _trainer(1, callbacks=[ReferenceModelCallback(), Batch()])
    t.fit(rl, _rl_dm(cache_dir))
    assert len(calls) == 2  # inner step 1 (policy = reference: KL 0), inner step 2 (after one update)
    comp, batch = seen["comp"], seen["batch"]
    comp_mask = (comp != rl.tokenizer.pad_token_id).long()  # completions here never write pad before their EOS
    with torch.no_grad():
        if shared_prompt_forward:
            ref = completion_logprobs(sft, batch["input_ids"], batch["attention_mask"], comp, comp_mask, 2)
            tgt = comp_mask
        else:
            ids = torch.cat([batch["input_ids"].repeat_interleave(2, 0), comp], 1)
            mask = torch.cat([batch["attention_mask"].repeat_interleave(2, 0), comp_mask], 1)
            from lightning_modules.policy.causal_lm import position_ids_from_mask
            ref = token_logprobs(sft(input_ids=ids, attention_mask=mask,
                                     position_ids=position_ids_from_mask(mask)).logits, ids)
            tgt = torch.zeros_like(mask[:, 1:])
            tgt[:, batch["input_ids"].shape[1] - 1:] = comp_mask
    for logp, ref_logp in calls:
        torch.testing.assert_close(ref_logp * tgt, ref * tgt, atol=2e-6, rtol=0)
    logp, _ = calls[1]
    kl = masked_sequence_mean(real_k3(logp, ref), tgt)
    assert float(kl) > 1e-4  # the update moved the adapters: a KL to check
    assert float(t.callback_metrics["rl/kl"]) == pytest.approx(float(kl), abs=1e-6)
    first, _ = calls[0]
    assert float(masked_sequence_mean(real_k3(first, calls[0][1]), tgt)) == 0.0


def test_a_lora_rl_checkpoint_starts_the_next_stage_and_loads_back(tmp_path, cache_dir):
    # SFT (LoRA) -> RL (LoRA) -> RL (LoRA, from the first RL: temporal stage 2); the RL checkpoint also loads back
    # into a module of the same config for `validate`, and a module without --model.lora is refused naming it
    sft, _ = _sft_ckpt(tmp_path, cache_dir, LORA)
    rl1 = PolicyRLModule(init_checkpoint=sft, lora=LORA, reference_coef=0.1, group_size=2, max_new_tokens=4, lr=5e-2)
    t = _trainer(2, callbacks=[ReferenceModelCallback()])
    t.fit(rl1, _rl_dm(cache_dir))
    path = str(tmp_path / "rl1.ckpt")
    t.save_checkpoint(path)
    ids, mask, comp, cmask = _prompts_and_completions(_rl_dm(cache_dir))
    with torch.no_grad():
        trained = completion_logprobs(rl1.model.eval(), ids, mask, comp, cmask, 2)

    rl2 = PolicyRLModule(init_checkpoint=path, lora=LORA, reference_coef=0.1, group_size=2, max_new_tokens=4)
    ref_cb = ReferenceModelCallback()
    _trainer(0, callbacks=[ref_cb]).fit(rl2, _rl_dm(cache_dir))
    ref_cb.setup(None, rl2, "fit")
    torch.testing.assert_close(completion_logprobs(ref_cb, ids, mask, comp, cmask, 2), trained, atol=2e-6, rtol=0)

    same = PolicyRLModule(init_checkpoint=sft, lora=LORA, reference_coef=0.1, group_size=2, max_new_tokens=4)
    _trainer(0, limit_val_batches=1).validate(same, _rl_dm(cache_dir), ckpt_path=path, verbose=False)
    with torch.no_grad():
        assert torch.equal(completion_logprobs(same.model.eval(), ids, mask, comp, cmask, 2), trained)
    plain = PolicyRLModule(init_checkpoint=sft, reference_coef=0.1, group_size=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="trained with --model.lora and this run is without it"):
        _trainer(0, limit_val_batches=1).validate(plain, _rl_dm(cache_dir), ckpt_path=path, verbose=False)


def test_lora_rl_from_a_lora_sft_without_lora_trains_the_merged_model(tmp_path, cache_dir):
    sft, _ = _sft_ckpt(tmp_path, cache_dir, LORA)
    rl = PolicyRLModule(init_checkpoint=sft, reference_coef=0.1, group_size=2, max_new_tokens=4)
    rec = _Record()
    _trainer(1, callbacks=[ReferenceModelCallback(), rec]).fit(rl, _rl_dm(cache_dir))
    assert rec.mode == "copy" and not hasattr(rl.model, "peft_config")
    assert trainable_parameters(rl.model) == sum(p.numel() for p in rl.model.parameters())


def test_resumed_lora_sft_equals_uninterrupted(tmp_path, cache_dir):
    # one batch per epoch (the whole training set): the trigger data module shuffles from the global RNG, which a
    # resumed process does not share, so only then is the data of epoch 2 the same rows (in another order)
    def run(root, epochs, ckpt_path=None, callbacks=()):
        L.seed_everything(3)
        m = PolicySFTModule(lora=LORA, stop_fidelity=None, eval_generate=False, lr=1e-2, **TINY)
        t = _trainer(-1, max_epochs=epochs, default_root_dir=root, callbacks=list(callbacks),
                     enable_checkpointing=bool(callbacks))
        dm = TriggerDataModule(family="two_policies", num_train=32, batch_size=32, num_val_per_distribution=2,
                               cache_dir=cache_dir)
        t.fit(m, dm, ckpt_path=ckpt_path)
        return m

    full = run(str(tmp_path / "full"), 3)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, save_top_k=0)
    part = run(str(tmp_path / "part"), 1, callbacks=[ckpt])
    resumed = run(str(tmp_path / "resumed"), 3, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    named, after_one = dict(resumed.model.named_parameters()), dict(part.model.named_parameters())
    for n, p in full.model.named_parameters():
        torch.testing.assert_close(named[n], p, atol=1e-6, rtol=0, msg=n)
        if ".lora_B." in n:  # two more epochs moved every adapter: the equality is not the checkpoint's own
            assert (p - after_one[n]).abs().max() > 1e-4, n


# ---- export -------------------------------------------------------------------------------------------------------
def test_export_of_a_lora_policy_is_the_merged_model(tmp_path, cache_dir):
    from transformers import AutoModelForCausalLM

    from cli import main

    path, m = _sft_ckpt(tmp_path, cache_dir, LORA)
    out = str(tmp_path / "policy")
    main(["export", "--ckpt_path", path, "--out_dir", out])  # checks the pipeline's greedy completions itself
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in k for k in exported.state_dict())
    ids, mask, comp, cmask = _prompts_and_completions(_sft_dm(cache_dir))
    with torch.no_grad():
        torch.testing.assert_close(completion_logprobs(exported, ids, mask, comp, cmask, 2),
                                   completion_logprobs(m.model.eval(), ids, mask, comp, cmask, 2), atol=2e-6, rtol=0)


# ---- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lora, message", [
    (dict(r=0), r"--model.lora.r must be an integer >= 1, got 0"),
    (dict(alpha=0), r"--model.lora.alpha must be > 0"),
    (dict(dropout=1.0), r"--model.lora.dropout must be in \[0, 1\)"),
    (dict(target_modules=[]), r"--model.lora.target_modules must be 'all-linear' or a non-empty list"),
    (dict(rank=4), r"--model.lora has no field 'rank'"),
])
def test_bad_lora_fields_are_refused_at_construction(lora, message):
    with pytest.raises(ValueError, match=message):
        PolicySFTModule(lora=lora, **TINY)
    with pytest.raises(ValueError, match=message):
        PolicyRLModule(lora=lora, min_sft_fidelity=0.0, **TINY)


@pytest.mark.parametrize("targets, why", [(["q_proj"], "not found"), (["ln_1"], "not supported")])
def test_target_modules_the_model_lacks_or_peft_cannot_adapt_are_refused(cache_dir, targets, why):
    m = PolicySFTModule(lora=dict(r=4, target_modules=targets), **TINY)
    with pytest.raises(ValueError, match=re.escape(f"--model.lora.target_modules {targets!r} cannot be adapted on "
                                                   "GPT2LMHeadModel: ") + f".*{why}"):
        _trainer(0).fit(m, _sft_dm(cache_dir))


def test_cli_chain_lora_sft_to_lora_rl_and_validate_from_the_checkpoint(tmp_path, cache_dir, monkeypatch):
    # through cli.py: the dataclass from the command line, the KL's reference callback cli.py adds, the RL checkpoint
    # (lora saved as plain values: `--ckpt_path` reads hyperparameters with weights_only) read back by `validate`
    from cli import main

    sft, _ = _sft_ckpt(tmp_path, cache_dir, LORA)
    monkeypatch.chdir(tmp_path)  # the config's checkpoint folder is relative: runs/ under tmp_path
    common = ["--config", os.path.join(ROOT, "configs/mixture/two_policies_rl_A.yaml"), f"--model.init_checkpoint={sft}",
              "--model.lora={r: 4, alpha: 8}", "--model.reference_coef=0.04", "--model.group_size=2",
              "--model.max_new_tokens=4", f"--data.cache_dir={cache_dir}", "--data.batch_size=2",
              "--data.num_val_per_distribution=2", "--data.val_batch_size=4", "--trainer.limit_val_batches=1",
              f"--trainer.default_root_dir={tmp_path}"]
    cli = main(["fit", *common, "--data.num_train=4", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
                "--trainer.num_sanity_val_steps=0"])
    module = cli.model
    assert trainable_parameters(module.model) == ADAPTER_PARAMS and cli.trainer.global_step == 2
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    assert torch.load(ckpt, weights_only=True)["hyper_parameters"]["lora"] == dict(LORA, dropout=0.0,
                                                                                    target_modules="all-linear")
    again = main(["validate", *common, f"--ckpt_path={ckpt}"])
    for (n, p), (_, q) in zip(module.model.named_parameters(), again.model.named_parameters()):
        assert torch.equal(p, q), n
