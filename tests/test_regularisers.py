"""Regularisers as plug-ins (docs/robust_baselines.md, "Regularisers as plug-ins"): a new one is one class plus a
config and trains through cli.py; the shipped five give the same loss, bit for bit, spelt as shorthands or as a
plug-in list, composed exactly as the training step composed them before; both spellings are one stage identity."""
import json
import os

import lightning.pytorch as pl
import pytest
import torch
import yaml

from callbacks.reference_model import ReferenceModelCallback
from lightning_modules.reward.losses import batch_sum_to_zero_loss, reward_centering_loss
from lightning_modules.reward.objectives import SoftBradleyTerry
from lightning_modules.reward.regularisers import BSR, GRM, L2SP, Anchor, Regulariser, RewardCentering, StepOutputs
from lightning_modules.reward.robust_finetuning import l2sp_penalty
from protocols.engine.stage_identity import digest, resolve_cli_config, without_location
from tests.helpers import quiet_trainer, tiny_data, tiny_model
from tests.test_cli_configs import CPU, SMALL_SYNTH, SYNTH, TINY
from tests.test_robust_objectives import _batch


class MarginPenalty(Regulariser):
    """A baseline defined here only: coef · mean(Δ²), the pairs' squared reward margins.

    Args:
        coef: its weight.
    """

    def __init__(self, coef: float = 0.1):
        self.coef = float(coef)

    def term(self, out: StepOutputs):
        penalty = (out.rewards_a - out.rewards_b).square().mean()
        return self.coef * penalty, {"train/margin_penalty": penalty.detach()}


def test_a_regulariser_defined_in_a_test_trains_through_cli_from_a_config_file(tmp_path):
    from cli import main

    config = tmp_path / "margin_penalty.yaml"
    config.write_text(yaml.safe_dump({"model": {"init_args": {"regularisers": [
        {"class_path": f"{__name__}.MarginPenalty", "init_args": {"coef": 0.5}}]}}}))
    fit = main(["fit", "--config", CPU, "--config", TINY, "--config", SYNTH, "--config", str(config),
                f"--data.cache_dir={tmp_path / 'cache'}", f"--data.source_options={SMALL_SYNTH}",
                "--model.objective=naive", "--trainer.logger=false", "--trainer.max_steps=2",
                "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={tmp_path}"])
    assert [type(r).__name__ for r in fit.model.regularisers] == ["MarginPenalty"]
    assert fit.trainer.global_step == 2
    m = {k: float(v) for k, v in fit.trainer.callback_metrics.items()}
    assert m["train/margin_penalty"] > 0
    assert m["train/loss"] == pytest.approx(m["train/pref_loss"] + 0.5 * m["train/margin_penalty"], rel=1e-6)
    saved = torch.load(os.path.join(tmp_path, "checkpoints", "last.ckpt"), map_location="cpu", weights_only=True)
    assert saved["hyper_parameters"]["regularisers"] == [
        {"class_path": f"{__name__}.MarginPenalty", "init_args": {"coef": 0.5}}]  # a test --ckpt_path rebuilds it


ALL_FIVE = dict(grm_coef=0.1, grm_form="dpo", center_rewards_coef=0.1, bsr_coef=0.01, anchor_coef=10.0,
                anchor_layers=[0.5, 1.0], l2sp_coef=0.1)


def _plugins():
    return [GRM(0.1, "dpo"), RewardCentering(0.1), BSR(0.01), Anchor(10.0, [0.5, 1.0]), L2SP(0.1)]


def test_the_five_compose_as_the_training_step_did_bit_for_bit(word_tokenizer_dir):
    """loss = ((((1 − α)·L_pref + α·L_grm) + c·L_center) + λ_bsr·L_bsr) + λ·L_anchor) + λ_l2sp·L_l2sp, the order of
    the step before the plug-ins, in float32 at tolerance 0; the shorthands and the plug-in list are one model."""
    batch = _batch(word_tokenizer_dir, q=(0.8, 0.3))
    losses = {}
    for name, kwargs in (("shorthands", ALL_FIVE), ("plug-ins", dict(regularisers=_plugins()))):
        pl.seed_everything(0)
        model = tiny_model(word_tokenizer_dir, objective=SoftBradleyTerry(), **kwargs)
        ReferenceModelCallback().setup(None, model, "fit")  # a frozen copy of the initial student
        with torch.no_grad():
            for p in model.backbone.parameters():  # away from θ₀ and from the reference: every term nonzero
                p.add_(0.01 * torch.randn_like(p))
        with pytest.warns(UserWarning, match="self.log"):
            losses[name] = model.training_step(batch, 0).detach()
        grm, center, bsr, anchor, l2sp = model.regularisers
        with torch.no_grad():
            rewards, hidden = model(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
            r_a, r_b = rewards.chunk(2)
            pref = SoftBradleyTerry()(r_a - r_b, batch["labels"], 0.0)
            terms = [grm.loss(model, batch, hidden[-1]), reward_centering_loss(r_a, r_b),
                     batch_sum_to_zero_loss(r_a, r_b), anchor.loss(model, batch, hidden),
                     l2sp_penalty(model.backbone, model.pretrained_weights, model.finetuned_names)]
        assert all(float(t) > 0 for t in terms)
        expected = ((((0.9 * pref + 0.1 * terms[0]) + 0.1 * terms[1]) + 0.01 * terms[2]) + 10.0 * terms[3]) \
            + 0.1 * terms[4]
        assert torch.equal(losses[name], expected), name
    assert torch.equal(losses["shorthands"], losses["plug-ins"])


def test_shorthands_and_plug_ins_train_the_same_weights(word_tokenizer_dir, cache_dir, tmp_path):
    states = {}
    for name, kwargs in (("shorthands", ALL_FIVE), ("plug-ins", dict(regularisers=_plugins()))):
        pl.seed_everything(0)
        model = tiny_model(word_tokenizer_dir, objective=SoftBradleyTerry(), **kwargs)
        dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="student")
        quiet_trainer(str(tmp_path / name), max_steps=2, limit_val_batches=0,
                      callbacks=[ReferenceModelCallback()]).fit(model, dm)
        states[name] = model.state_dict()
    assert all(torch.equal(v, states["plug-ins"][k]) for k, v in states["shorthands"].items())


BASE = ["--config", CPU, "--config", TINY, "--config", SYNTH]


def _identity(*extra):
    return digest(without_location(resolve_cli_config(BASE + list(extra))))


def test_a_plug_in_list_the_shorthands_can_spell_is_their_stage_identity():
    anchor = '{"class_path": "Anchor", "init_args": {"coef": 10, "layers": [0.5, 1.0]}}'
    shorthand = _identity("--model.anchor_coef=10", "--model.anchor_layers=[0.5, 1.0]")
    assert _identity(f"--model.regularisers=[{anchor}]") == shorthand
    assert _identity("--model.regularisers+=lightning_modules.reward.regularisers.anchor.Anchor",
                     "--model.regularisers.coef=10", "--model.regularisers.layers=[0.5, 1.0]") == shorthand
    assert _identity('--model.regularisers=[{"class_path": "BSR", "init_args": {"coef": 0}}]') == _identity()
    # a shorthand, then a later kind as a plug-in: the same run as both shorthands
    assert _identity("--model.anchor_coef=10", '--model.regularisers=[{"class_path": "L2SP", "init_args": '
                     '{"coef": 0.1}}]') == _identity("--model.anchor_coef=10", "--model.l2sp_coef=0.1")
    # another order adds the terms in another order: another run, another stage
    two = '[{"class_path": "Anchor", "init_args": {"coef": 10}}, {"class_path": "BSR", "init_args": {"coef": 0.5}}]'
    assert _identity(f"--model.regularisers={two}") != _identity("--model.anchor_coef=10", "--model.bsr_coef=0.5")
    custom = _identity(f'--model.regularisers=[{{"class_path": "{__name__}.MarginPenalty"}}]')
    assert custom not in (_identity(), shorthand)


ANCHOR_PATH = "lightning_modules.reward.regularisers.Anchor"


@pytest.mark.parametrize("kwargs,message", [
    (dict(anchor_coef=1.0, regularisers=[{"class_path": ANCHOR_PATH, "init_args": {"coef": 2.0}}]),
     r"--model.anchor_coef and --model.regularisers both give Anchor: give it once"),
    (dict(regularisers=[{"class_path": "nosuch.Thing"}]), r"--model.regularisers: 'nosuch.Thing' cannot be imported"),
    (dict(regularisers=[{"class_path": "torch.nn.Linear"}]), r"'torch.nn.Linear' is not a Regulariser subclass"),
    (dict(regularisers=[{"class_path": ANCHOR_PATH, "init_args": {"coef": -1.0}}]),
     r"--model.anchor_coef must be >= 0"),
    (dict(regularisers=[{"class_path": "lightning_modules.reward.regularisers.L2SP", "init_args": {"coef": 0.1}}],
          lora={"r": 4}), r"--model.l2sp_coef with --model.lora"),
])
def test_bad_plug_ins_are_refused_in_one_line(word_tokenizer_dir, kwargs, message):
    from lightning_modules.reward.backbones import LoraSpec

    if "lora" in kwargs:
        kwargs = {**kwargs, "lora": LoraSpec(**kwargs["lora"])}
    with pytest.raises(ValueError, match=message) as err:
        tiny_model(word_tokenizer_dir, **kwargs)
    assert "\n" not in str(err.value)


def test_a_plug_in_on_an_outside_classifier_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--model.regularisers MarginPenalty: .* only evaluates"):
        tiny_model(None, backbone=f"hf_classifier:{tmp_path}", tokenizer="x", regularisers=[MarginPenalty()])
