"""The robust fine-tuning baselines ANCHOR is compared with (docs/robust_baselines.md): L2-SP is the hand sum over the
trainable backbone parameters and adds to the loss beside ANCHOR; LP-FT trains the head alone, then everything, also
after a resume and over a cached frozen prefix; WiSE-FT gives θ₀ at α = 0, the fine-tuned model at α = 1 and the hand
average between; bad values and combinations are refused naming the flag."""
import json
import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from callbacks.reference_model import ReferenceModelCallback
from lightning_modules.reward.backbones import LoraSpec
from lightning_modules.reward.reward_model import RewardModelModule
from lightning_modules.reward.robust_finetuning import l2sp_penalty
from tests.helpers import quiet_trainer, synth_options, tiny_data, tiny_model


def _data(tok, cache_dir):
    return tiny_data(tok, cache_dir, train_subset="student", max_length=48, batch_size=8,
                     source_options=synth_options(n_train=96, n_validation=16, n_test=16))


def _backbone_state(model):
    return {n: p.detach().clone() for n, p in model.backbone.named_parameters()}


def _adamw(decay=0.0):
    return lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=decay)


# ---- L2-SP --------------------------------------------------------------------------------------------------------
def test_l2sp_distance_is_the_hand_sum_over_trainable_backbone_parameters_only(word_tokenizer_dir):
    pl.seed_everything(0)
    model = tiny_model(word_tokenizer_dir, l2sp_coef=0.5, freeze_layers=1)
    names = model.finetuned_names
    assert names and not [n for n in names if n.startswith(("layers.0.", "embed_tokens"))]
    assert float(l2sp_penalty(model.backbone, model.pretrained_weights, names).detach()) == 0.0
    with torch.no_grad():
        model.backbone.layers[1].mlp.up_proj.weight[0, 0] += 0.5
        model.backbone.layers[1].mlp.up_proj.weight[3, 2] -= 0.25
        model.backbone.norm.weight += 0.125  # 64 elements
        model.head.score.weight += 1.0  # the head: excluded (no pretrained value)
        model.backbone.layers[0].mlp.up_proj.weight += 2.0  # a frozen layer: excluded
        model.backbone.embed_tokens.weight += 3.0  # frozen embeddings: excluded
    expected = 0.5 ** 2 + 0.25 ** 2 + 64 * 0.125 ** 2  # a sum over elements, no 1/2, no mean
    distance = float(l2sp_penalty(model.backbone, model.pretrained_weights, names).detach())
    assert distance == pytest.approx(expected, rel=1e-6)
    # θ₀ is no parameter, buffer or checkpoint entry
    plain = tiny_model(word_tokenizer_dir, freeze_layers=1)
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert [n for n, _ in model.named_buffers()] == [n for n, _ in plain.named_buffers()]


class _L2SPRecorder(Callback):
    """Before each step, Σ‖θ − θ₀‖² by hand from its own copy of θ₀; after it, what the module logged."""

    def __init__(self, theta0, names):
        self.theta0, self.names, self.rows = theta0, names, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        params = dict(pl_module.backbone.named_parameters())
        self.hand = sum(float(((params[n].detach() - self.theta0[n]) ** 2).sum()) for n in self.names)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.rows.append((self.hand, m["train/l2sp"], m["train/l2sp_term"], m["train/loss"], m["train/pref_loss"],
                          m["train/anchor_term"]))


def test_l2sp_adds_to_the_loss_beside_anchor_and_is_logged(word_tokenizer_dir, cache_dir, tmp_path):
    pl.seed_everything(0)
    lam = 0.5
    model = tiny_model(word_tokenizer_dir, l2sp_coef=lam, anchor_coef=10.0, freeze_layers=1)
    trainable = [n for n, p in model.backbone.named_parameters() if p.requires_grad]
    assert model.finetuned_names == trainable
    rec = _L2SPRecorder(_backbone_state(model), trainable)
    quiet_trainer(str(tmp_path), max_steps=4, limit_val_batches=0,
                  callbacks=[ReferenceModelCallback(), rec]).fit(model, _data(word_tokenizer_dir, cache_dir))
    assert len(rec.rows) == 4 and rec.rows[0][1] == 0.0  # θ = θ₀ before the first step
    for hand, l2sp, term, loss, pref, anchor_term in rec.rows:
        assert l2sp == pytest.approx(hand, rel=1e-5, abs=1e-12)
        assert term == pytest.approx(lam * hand, rel=1e-5, abs=1e-12)
        assert loss == pytest.approx(pref + anchor_term + term, rel=1e-6)
    assert rec.rows[-1][1] > 0 and rec.rows[-1][5] > 0  # both terms at work by the last step


def test_l2sp_loss_equals_the_loss_without_plus_lambda_times_the_distance(word_tokenizer_dir, cache_dir):
    pl.seed_everything(0)
    model = tiny_model(word_tokenizer_dir, l2sp_coef=0.25)
    with torch.no_grad():
        for p in model.backbone.parameters():
            p.add_(0.01 * torch.randn_like(p))
    dm = _data(word_tokenizer_dir, cache_dir)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    distance = float(l2sp_penalty(model.backbone, model.pretrained_weights, model.finetuned_names).detach())
    with pytest.warns(UserWarning, match="self.log"):  # no trainer: nothing logged, the loss still returned
        with_l2sp = float(model.training_step(batch, 0))
    model.regularisers = []  # the L2SP plug-in out: the same step without its term
    with pytest.warns(UserWarning, match="self.log"):
        without = float(model.training_step(batch, 0))
    assert distance > 0
    assert with_l2sp == pytest.approx(without + 0.25 * distance, rel=1e-6)


# ---- LP-FT --------------------------------------------------------------------------------------------------------
class _EpochRecorder(Callback):
    """requires_grad of the backbone at each epoch's first step; head and backbone weights at each epoch's end."""

    def __init__(self):
        self.trainable, self.head, self.backbone, self.seen = {}, {}, {}, set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch not in self.seen:
            self.seen.add(trainer.current_epoch)
            self.trainable[trainer.current_epoch] = {
                n: p.requires_grad for n, p in pl_module.backbone.named_parameters() if n in pl_module.finetuned_names}

    def on_train_epoch_end(self, trainer, pl_module):
        self.head[trainer.current_epoch] = pl_module.head.score.weight.detach().clone()
        self.backbone[trainer.current_epoch] = _backbone_state(pl_module)


def _lpft_fit(tok, cache_dir, root, **kwargs):
    pl.seed_everything(0)
    model = tiny_model(tok, linear_probe_epochs=1, optimizer=_adamw(decay=0.1), **kwargs)  # decay: skipped too
    init_backbone, init_head = _backbone_state(model), model.head.score.weight.detach().clone()
    rec = _EpochRecorder()
    trainer = quiet_trainer(root, max_epochs=2, limit_train_batches=3, limit_val_batches=0,
                            callbacks=[ReferenceModelCallback(), rec])
    trainer.fit(model, _data(tok, cache_dir))
    return model, trainer, rec, init_backbone, init_head


def test_linear_probe_trains_the_head_alone_then_the_backbone(word_tokenizer_dir, cache_dir, tmp_path):
    model, trainer, rec, init, init_head = _lpft_fit(word_tokenizer_dir, cache_dir, str(tmp_path))
    names = model.finetuned_names
    assert len(names) == len(list(model.backbone.parameters()))  # nothing frozen by freeze_layers here
    assert not any(rec.trainable[0].values()) and all(rec.trainable[1].values())
    # epoch 0: the backbone bit-identical (AdamW skipped it, weight decay included), the head moved
    assert all(torch.equal(rec.backbone[0][n], init[n]) for n in init)
    assert not torch.equal(rec.head[0], init_head)
    # epoch 1: every backbone parameter moved, from the probed head on
    assert [n for n in names if torch.equal(rec.backbone[1][n], rec.backbone[0][n])] == []
    # the optimizer held every parameter that would ever train from the start
    held = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert held == {id(p) for p in model.backbone.parameters()} | {id(model.head.score.weight)}


def test_linear_probe_over_a_cached_frozen_prefix_trains_like_the_plain_forward(word_tokenizer_dir, cache_dir,
                                                                                 tmp_path):
    """During the probe the whole backbone is frozen, yet the store memoises hidden state `freeze_layers` only."""
    three = {"num_hidden_layers": 3}
    plain, _, plain_rec, init, _ = _lpft_fit(word_tokenizer_dir, cache_dir, str(tmp_path / "plain"), freeze_layers=1,
                                             tiny_config=three, last_token_scoring=False, anchor_coef=10.0)
    cached, _, rec, _, _ = _lpft_fit(word_tokenizer_dir, cache_dir, str(tmp_path / "cached"), freeze_layers=1,
                                     tiny_config=three, anchor_coef=10.0, cache_frozen_prefix=True)
    assert not [n for n in cached.finetuned_names if n.startswith(("layers.0.", "embed_tokens"))]
    assert cached.frozen_prefix.k == 1 and cached.frozen_prefix.stored_rows > 0
    assert not any(rec.trainable[0].values()) and all(rec.trainable[1].values())
    assert all(torch.equal(rec.backbone[0][n], init[n]) for n in init)  # probe: nothing in the backbone moved
    for n in init:
        if n.startswith(("layers.0.", "embed_tokens")):  # the prefix: frozen throughout
            assert torch.equal(rec.backbone[1][n], init[n]), n
        else:
            assert not torch.equal(rec.backbone[1][n], init[n]), n
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(cached.state_dict()[k], v, rtol=1e-4, atol=5e-5)


def test_linear_probe_unfreezes_in_a_second_fit_of_a_module_left_frozen(word_tokenizer_dir, cache_dir, tmp_path):
    """A fit that ends inside the probe leaves requires_grad False; the next fit's optimizer must still hold the
    backbone, or its fine-tuning epochs would silently train the head alone."""
    pl.seed_everything(0)
    model = tiny_model(word_tokenizer_dir, linear_probe_epochs=1)
    data = _data(word_tokenizer_dir, cache_dir)
    quiet_trainer(str(tmp_path / "a"), max_epochs=1, limit_train_batches=2, limit_val_batches=0).fit(model, data)
    assert not any(p.requires_grad for p in model.backbone.parameters())
    before = _backbone_state(model)
    rec = _EpochRecorder()
    quiet_trainer(str(tmp_path / "b"), max_epochs=2, limit_train_batches=2, limit_val_batches=0,
                  callbacks=[rec]).fit(model, data)
    assert all(torch.equal(rec.backbone[0][n], before[n]) for n in before)
    assert [n for n in before if torch.equal(rec.backbone[1][n], before[n])] == []


class _FirstStepTrainable(Callback):
    def __init__(self):
        self.state = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.state is None:
            self.state = (trainer.current_epoch, {p.requires_grad for p in pl_module.backbone.parameters()})


def test_linear_probe_state_after_resume_follows_the_epoch(word_tokenizer_dir, cache_dir, tmp_path):
    """k = 2: a run resumed into epoch 1 (= k − 1) still probes; one resumed into epoch 2 (= k) trains the backbone,
    and ends with the weights of the uninterrupted run."""
    k, tok = 2, word_tokenizer_dir

    def fit(root, max_epochs, ckpt_path=None, callbacks=()):
        pl.seed_everything(0 if ckpt_path is None else 123)  # a resumed process has another RNG state
        model = tiny_model(tok, linear_probe_epochs=k, optimizer=_adamw(decay=0.1))
        trainer = quiet_trainer(str(tmp_path / root), max_epochs=max_epochs, limit_train_batches=2,
                                limit_val_batches=0, callbacks=list(callbacks), enable_checkpointing=bool(callbacks))
        trainer.fit(model, _data(tok, cache_dir), ckpt_path=ckpt_path)
        return model

    ckpts = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), filename="e{epoch}", save_top_k=-1, every_n_epochs=1,
                            auto_insert_metric_name=False)
    fit("first", 2, callbacks=[ckpts])
    full = fit("full", 3)
    for saved_epoch, resumed_epoch, trains in ((0, k - 1, False), (1, k, True)):
        first = _FirstStepTrainable()
        resumed = fit(f"resumed{saved_epoch}", 3, str(tmp_path / "ckpt" / f"e{saved_epoch}.ckpt"), [first])
        assert first.state == (resumed_epoch, {trains})
        for (n, p), (_, q) in zip(full.named_parameters(), resumed.named_parameters()):
            torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=n)


def test_linear_probe_with_lora_probes_then_trains_the_adapters(word_tokenizer_dir, cache_dir, tmp_path):
    pytest.importorskip("peft")
    model, _, rec, init, _ = _lpft_fit(word_tokenizer_dir, cache_dir, str(tmp_path), lora=LoraSpec(r=4))
    assert model.finetuned_names and all("lora_" in n for n in model.finetuned_names)
    assert not any(rec.trainable[0].values()) and all(rec.trainable[1].values())
    assert all(torch.equal(rec.backbone[0][n], init[n]) for n in init)
    assert all(torch.equal(rec.backbone[1][n], init[n]) != ("lora_" in n) for n in init)  # adapters only moved


# ---- WiSE-FT ------------------------------------------------------------------------------------------------------
@pytest.fixture()
def finetuned(word_tokenizer_dir, cache_dir, tmp_path):
    """θ₀ (a tiny backbone built under seed 5, layer 1 frozen) and a checkpoint fine-tuned from it."""
    pl.seed_everything(5)
    student = tiny_model(word_tokenizer_dir, freeze_layers=1)
    theta0 = _backbone_state(student)
    trainer = quiet_trainer(str(tmp_path / "ft"), max_steps=6, limit_val_batches=0)
    trainer.fit(student, _data(word_tokenizer_dir, cache_dir))
    path = str(tmp_path / "student.ckpt")
    trainer.save_checkpoint(path)
    return theta0, torch.load(path, weights_only=True)["state_dict"], path


def _wise(tok, alpha, seed=5, **kwargs):
    pl.seed_everything(seed)  # the student's construction seed: the same θ₀
    return tiny_model(tok, freeze_layers=1, wise_ft_alpha=alpha, **kwargs)


def _test(model, tok, cache_dir, root, ckpt):
    quiet_trainer(root).test(model, _data(tok, cache_dir), ckpt_path=ckpt, verbose=False)
    return model.test_results


def test_wise_ft_endpoints_and_midpoint(word_tokenizer_dir, cache_dir, tmp_path, finetuned):
    theta0, ft, ckpt = finetuned
    tok = word_tokenizer_dir
    assert any(not torch.equal(ft[f"backbone.{n}"], theta0[n]) for n in theta0)
    plain = _test(tiny_model(tok, freeze_layers=1), tok, cache_dir, str(tmp_path / "plain"), ckpt)

    zero = _wise(tok, 0.0)
    zero.load_state_dict(ft)
    for n, p in zero.backbone.named_parameters():
        assert torch.equal(p, theta0[n]), n  # the pretrained backbone exactly
    assert torch.equal(zero.head.score.weight, ft["head.score.weight"])  # the fine-tuned head, for every α

    one = _wise(tok, 1.0)
    assert _test(one, tok, cache_dir, str(tmp_path / "one"), ckpt) == plain  # the fine-tuned model exactly
    for n, p in one.backbone.named_parameters():
        assert torch.equal(p, ft[f"backbone.{n}"]), n

    half = _wise(tok, 0.5)
    _test(half, tok, cache_dir, str(tmp_path / "half"), ckpt)  # through Lightning's checkpoint restore
    for n, p in half.backbone.named_parameters():
        assert torch.equal(p, 0.5 * theta0[n] + 0.5 * ft[f"backbone.{n}"]), n
    assert torch.equal(half.head.score.weight, ft["head.score.weight"])
    assert half.wise_ft_applied and "wise_ft_alpha" not in half.hparams  # never saved: it would apply twice


def test_wise_ft_over_a_cached_frozen_prefix_scores_like_the_plain_forward(word_tokenizer_dir, cache_dir, tmp_path,
                                                                            finetuned):
    _, _, ckpt = finetuned
    tok = word_tokenizer_dir
    plain = _test(_wise(tok, 0.5), tok, cache_dir, str(tmp_path / "plain"), ckpt)
    cached_model = _wise(tok, 0.5, cache_frozen_prefix=True)
    cached = _test(cached_model, tok, cache_dir, str(tmp_path / "cached"), ckpt)
    assert cached_model.frozen_prefix.stored_rows > 0
    assert {s: r["acc"] for s, r in cached.items()} == {s: r["acc"] for s, r in plain.items()}


def test_wise_ft_refuses_weights_not_fine_tuned_from_its_theta0(word_tokenizer_dir, finetuned):
    _, ft, _ = finetuned
    other = _wise(word_tokenizer_dir, 0.5, seed=6)  # another random θ₀: the frozen layer 1 differs
    with pytest.raises(ValueError, match=r"wise_ft_alpha: the loaded weights differ .*(embed_tokens|layers\.0)"):
        other.load_state_dict(ft)


def test_wise_ft_needs_loaded_weights_and_is_not_for_fit(word_tokenizer_dir, cache_dir, tmp_path):
    model = _wise(word_tokenizer_dir, 0.5)
    with pytest.raises(ValueError, match="--model.wise_ft_alpha .* none were loaded: give --ckpt_path"):
        quiet_trainer(str(tmp_path)).test(model, _data(word_tokenizer_dir, cache_dir), verbose=False)
    with pytest.raises(ValueError, match="--model.wise_ft_alpha .* Unset it for fit"):
        quiet_trainer(str(tmp_path), max_steps=1).fit(model, _data(word_tokenizer_dir, cache_dir))


# ---- refusals -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(l2sp_coef=-0.1), r"--model.l2sp_coef must be >= 0"),
    (dict(l2sp_coef=float("nan")), r"--model.l2sp_coef must be >= 0"),
    (dict(l2sp_coef=1.0, lora=LoraSpec(r=4)), r"--model.l2sp_coef with --model.lora"),
    (dict(linear_probe_epochs=-1), r"--model.linear_probe_epochs must be an integer >= 0"),
    (dict(linear_probe_epochs=1.5), r"--model.linear_probe_epochs must be an integer >= 0"),
    (dict(wise_ft_alpha=1.5), r"--model.wise_ft_alpha must be in \[0, 1\]"),
    (dict(wise_ft_alpha=-0.1), r"--model.wise_ft_alpha must be in \[0, 1\]"),
    (dict(wise_ft_alpha=0.5, lora=LoraSpec(r=4)), r"--model.wise_ft_alpha .* does not support --model.lora"),
])
def test_bad_values_are_refused_naming_the_flag(word_tokenizer_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(word_tokenizer_dir, **kwargs)


def test_linear_probe_refuses_ddp(word_tokenizer_dir):
    model = tiny_model(word_tokenizer_dir, linear_probe_epochs=1)
    model._trainer = type("TwoRanks", (), {"world_size": 2})()
    with pytest.raises(ValueError, match="--model.linear_probe_epochs runs in one process only"):
        model.on_fit_start()


def test_off_by_default_changes_nothing(word_tokenizer_dir):
    model = tiny_model(word_tokenizer_dir)
    assert (model.regularisers, model.linear_probe_epochs, model.wise_ft_alpha) == ([], 0, None)
    assert model.pretrained_weights is None and model.finetuned_names == []


# ---- through cli.py -------------------------------------------------------------------------------------------------
def test_flags_through_cli_fit_then_wise_ft_test(tmp_path, cache_dir):
    from cli import main
    from tests.test_cli_configs import CPU, SMALL_SYNTH, SYNTH, TINY

    common = ["--config", CPU, "--config", TINY, "--config", SYNTH, f"--data.cache_dir={cache_dir}",
              f"--data.source_options={SMALL_SYNTH}", "--trainer.logger=false"]
    fit = main(["fit", *common, "--model.l2sp_coef=0.01", "--model.linear_probe_epochs=1", "--trainer.max_epochs=2",
                "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
                f"--trainer.default_root_dir={tmp_path / 'fit'}"])
    assert (fit.model.regularisers[0].spec()["init_args"], fit.model.linear_probe_epochs) == ({"coef": 0.01}, 1)
    assert float(fit.trainer.callback_metrics["train/l2sp"]) > 0
    ckpt = os.path.join(str(tmp_path / "fit"), "checkpoints", "last.ckpt")
    theta0 = _backbone_state(main(common, run=False).model)  # built under the same seed_everything: θ₀
    ft = torch.load(ckpt, weights_only=True)["state_dict"]
    test = main(["test", *common, f"--ckpt_path={ckpt}", "--model.wise_ft_alpha=0.25",
                 f"--trainer.default_root_dir={tmp_path / 'test'}"])
    for n, p in test.model.backbone.named_parameters():
        assert torch.equal(p, 0.75 * theta0[n] + 0.25 * ft[f"backbone.{n}"]), n
    assert test.model.test_results and json.dumps(test.model.test_results)
