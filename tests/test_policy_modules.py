"""PolicySFTModule / PolicyRLModule on tiny models: learning, fidelity values, gating and bad inputs."""
import lightning as L
import pytest
import torch

from callbacks.persona_tracking import PersonaTrackingCallback
from callbacks.reference_model import ReferenceModelCallback, find_reference_callback
from datamodules.triggers.datamodule import TriggerDataModule
from lightning_modules.policy.base import completion_mask
from lightning_modules.policy.rl import PolicyRLModule
from lightning_modules.policy.sft import PolicySFTModule

TINY = dict(n_layer=1, n_embd=32, n_head=2, max_positions=64)


def _trainer(steps, **kw):
    kw.setdefault("num_sanity_val_steps", 0)
    kw.setdefault("limit_val_batches", 0)
    return L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu", devices=1, **kw)


def _sft_ckpt(tmp_path, cache_dir, fidelity, family="two_policies", name="sft.ckpt"):
    dm = TriggerDataModule(family=family, num_train=32, batch_size=16, num_val_per_distribution=2, cache_dir=cache_dir)
    m = PolicySFTModule(**TINY)
    t = _trainer(1)
    t.fit(m, dm)
    m.fidelity = {"mean": fidelity, "min": fidelity, "cells": {}, "step": 1}
    path = str(tmp_path / name)
    t.save_checkpoint(path)
    return path


def _rl_dm(cache_dir, **kw):
    kw = dict(dict(family="two_policies", mode="rl", train_distributions=["A"], num_train=8, batch_size=2,
                   num_val_per_distribution=3, val_batch_size=4, cache_dir=cache_dir), **kw)
    return TriggerDataModule(**kw)


def test_completion_mask_literal():
    comp = torch.tensor([[5, 6, 2, 7], [2, 0, 0, 0], [5, 5, 5, 5]])
    assert completion_mask(comp, eos_id=2).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_sft_lowers_loss(cache_dir):
    torch.manual_seed(0)
    dm = TriggerDataModule(family="two_policies", num_train=40 * 32, batch_size=32, num_val_per_distribution=2,
                           cache_dir=cache_dir)
    m = PolicySFTModule(lr=3e-3, **TINY)
    losses = []

    class Rec(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

    _trainer(40, callbacks=[Rec()]).fit(m, dm)
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_fidelity_of_a_uniform_model_is_one_over_vocab(cache_dir):
    dm = TriggerDataModule(family="two_policies", num_train=32, batch_size=16, num_val_per_distribution=3,
                           val_batch_size=6, cache_dir=cache_dir)
    m = PolicySFTModule(eval_generate=False, stop_fidelity=None, **TINY)
    t = _trainer(1, limit_val_batches=1.0)
    t.fit(m, dm)  # builds everything; then zero the weights -> all logits 0 -> uniform next-token distribution
    with torch.no_grad():
        for p in m.model.parameters():
            p.zero_()
    t.validate(m, dm, verbose=False)
    V = len(dm.tokenizer)
    assert set(m.fidelity["cells"]) == {"Alice/A", "Alice/B", "Bob/A", "Bob/B"}
    assert m.fidelity["mean"] == pytest.approx(1 / V) and m.fidelity["min"] == pytest.approx(1 / V)
    m.hparams.fidelity_measure = "branch"  # the prescribed branch against the other one: 1/2 for a uniform model
    t.validate(m, dm, verbose=False)
    assert m.fidelity["mean"] == pytest.approx(0.5) and m.fidelity["min"] == pytest.approx(0.5)


def test_sft_stop_rule_with_a_bar_on_the_worst_cell():
    m = PolicySFTModule(stop_fidelity=0.98, stop_capability=0.8, stop_fidelity_min=0.9, **TINY)
    assert m.reached_stop({"mean": 0.985, "min": 0.92}, 0.81)
    assert not m.reached_stop({"mean": 0.985, "min": 0.38}, 0.81)  # 6C3 seed 0: the mean passed with a broken cell
    assert not m.reached_stop({"mean": 0.97, "min": 0.95}, 0.81) and not m.reached_stop({"mean": 0.99, "min": 0.95}, 0.7)
    assert PolicySFTModule(stop_fidelity=0.98, **TINY).reached_stop({"mean": 0.985, "min": 0.38}, None)  # the default
    with pytest.raises(ValueError, match="--model.stop_fidelity_min"):
        PolicySFTModule(stop_fidelity=None, stop_fidelity_min=0.9, **TINY)


def test_rl_refuses_a_checkpoint_with_a_broken_cell(tmp_path, cache_dir):
    ckpt = _sft_ckpt(tmp_path, cache_dir, fidelity=0.99)
    state = torch.load(ckpt, weights_only=False)
    state["persona_fidelity"]["min"] = 0.3
    torch.save(state, ckpt)
    m = PolicyRLModule(init_checkpoint=ckpt, min_sft_fidelity=0.95, min_sft_fidelity_cell=0.8)
    with pytest.raises(ValueError, match="cell at fidelity 0.300 < --model.min_sft_fidelity_cell 0.8"):
        _trainer(1).fit(m, _rl_dm(cache_dir))


def test_rl_refuses_low_fidelity_checkpoint(tmp_path, cache_dir):
    ckpt = _sft_ckpt(tmp_path, cache_dir, fidelity=0.5)
    m = PolicyRLModule(init_checkpoint=ckpt, min_sft_fidelity=0.95)
    with pytest.raises(ValueError, match="--model.min_sft_fidelity 0.95"):
        _trainer(1).fit(m, _rl_dm(cache_dir))


def test_a_stage_started_from_an_rl_checkpoint_gets_the_architecture_of_the_chain(tmp_path, cache_dir):
    # temporal stage 2 starts from stage 1's RL checkpoint, and neither RL config names the architecture (the SFT
    # does): stage 1 must write the architecture it loaded, or stage 2 builds its config's default network (for
    # SmolLM2, a tiny GPT-2: "Missing key(s) in state_dict")
    sft = _sft_ckpt(tmp_path, cache_dir, fidelity=1.0)  # TINY: n_embd 32, 1 layer
    default = PolicyRLModule(init_checkpoint=sft).hparams
    assert (default["n_embd"], default["n_layer"]) != (TINY["n_embd"], TINY["n_layer"])  # the test's premise
    stage1 = PolicyRLModule(init_checkpoint=sft, group_size=2, max_new_tokens=4)
    t = _trainer(1)
    t.fit(stage1, _rl_dm(cache_dir))
    rl1 = str(tmp_path / "rl1.ckpt")
    t.save_checkpoint(rl1)
    written = torch.load(rl1, weights_only=False)["hyper_parameters"]
    assert {k: written[k] for k in TINY} == TINY
    stage2 = PolicyRLModule(init_checkpoint=rl1, group_size=2, max_new_tokens=4)
    _trainer(0).fit(stage2, _rl_dm(cache_dir))  # builds the network from rl1 and loads its weights
    assert stage2.model.config.n_embd == TINY["n_embd"] and stage2.model.config.n_layer == TINY["n_layer"]
    for (name, p1), p2 in zip(stage1.model.state_dict().items(), stage2.model.state_dict().values()):
        assert torch.equal(p1, p2), name


def test_rl_refuses_tokenizer_mismatch(tmp_path, cache_dir):
    ckpt = _sft_ckpt(tmp_path, cache_dir, fidelity=1.0, family="language")
    with pytest.raises(ValueError, match="--model.init_checkpoint .* different tokenizer"):
        _trainer(1).fit(PolicyRLModule(init_checkpoint=ckpt), _rl_dm(cache_dir))


def test_rl_bad_arguments_name_the_flag(cache_dir):
    with pytest.raises(ValueError, match="--model.init_checkpoint is required"):
        PolicyRLModule()
    with pytest.raises(ValueError, match="--model.group_size"):
        PolicyRLModule(min_sft_fidelity=0, group_size=1)
    with pytest.raises(ValueError, match="--model.algorithm"):
        PolicyRLModule(min_sft_fidelity=0, algorithm="ppo")
    with pytest.raises(ValueError, match="--data.mode rl"):
        _trainer(1).fit(PolicyRLModule(min_sft_fidelity=0, **TINY), _rl_dm(cache_dir, mode="sft"))


def test_persona_mask_covers_identity_tokens(tmp_path, cache_dir):
    m = PolicyRLModule(min_sft_fidelity=0, **TINY)
    dm = _rl_dm(cache_dir)
    _trainer(1).fit(m, dm)
    tok = dm.tokenizer
    ids = tok(["I am Alice . Distribution A . The answer is 94 .", "I am"], padding=True, add_special_tokens=False,
              return_tensors="pt")
    mask = m.persona_mask(ids["input_ids"], ids["attention_mask"])
    assert mask.tolist() == [[1, 1, 1, 1] + [0] * 8, [1, 1] + [0] * 10]


def _reward_first_of_each_group(m: PolicyRLModule) -> None:
    """An untrained model earns no reward: rig `m.score` so the first completion of each group gets 1."""
    score = m.score

    def rigged_score(completions, records):
        out = score(completions, records)
        out["reward"] = (torch.arange(len(records)) % m.hparams.group_size == 0).float()
        return out

    m.score = rigged_score


@pytest.mark.parametrize("persona_only, algorithm", [(False, "reinforce"), (True, "grpo")])
def test_rl_steps_update_policy_keep_reference_and_track(tmp_path, cache_dir, persona_only, algorithm):
    ckpt = _sft_ckpt(tmp_path, cache_dir, fidelity=0.99)
    start = {k: v.clone() for k, v in torch.load(ckpt, weights_only=False)["state_dict"].items()}
    m = PolicyRLModule(init_checkpoint=ckpt, group_size=4, lr=1e-2, reference_coef=0.1, max_new_tokens=6, algorithm=algorithm,
                       persona_tokens_only=persona_only, eval_temperature=1.0)
    _reward_first_of_each_group(m)
    track = PersonaTrackingCallback(output_dir=str(tmp_path / "out"), theory_overlay=persona_only)
    seen = {}

    class RefProbe(L.Callback):
        def on_train_end(self, trainer, pl_module):
            ref = find_reference_callback(trainer)
            assert pl_module.frozen_reference is ref  # handed in by the callback for the fit
            seen["ref"] = {k: v.clone() for k, v in ref.reference.model.state_dict().items()}

    t = _trainer(3, val_check_interval=3, check_val_every_n_epoch=None, limit_val_batches=1.0,
                 num_sanity_val_steps=-1, callbacks=[track, RefProbe(), ReferenceModelCallback()])
    t.fit(m, _rl_dm(cache_dir))
    assert all(torch.equal(v, start["model." + k]) for k, v in seen["ref"].items())  # the reference never moved
    changed = [k for k, v in m.state_dict().items() if k.startswith("model.") and not torch.equal(v, start[k])]
    assert changed  # the policy moved
    assert not any("reference" in k for k in m.state_dict())
    if algorithm == "reinforce":  # EMA of the mean reward (1/4 each step): 0.25 * (1 - 0.9^3)
        assert float(m.baseline) == pytest.approx(0.25 * (1 - 0.9 ** 3))
    assert [h["step"] for h in track.history] == [0, 3] and int(m.rl_step) == 3
    assert (tmp_path / "out" / "mixture_table.md").read_text().startswith("Steps 0 -> 3, n = 3 per distribution.")
    if persona_only:
        assert set(track.theory["R"]) == {"Alice", "Bob"} and (tmp_path / "out" / "theory_overlay.png").exists()
