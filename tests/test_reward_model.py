"""Reward model: training changes every parameter, learns the synthetic source, is seed-deterministic, resumes
exactly, and the tokenized cache is reused."""
import json
import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.helpers import SOURCE, TARGETS, quiet_trainer, synth_options, tiny_data, tiny_model


@pytest.mark.parametrize("backbone", ["tiny-qwen2", "tiny-llama", "tiny-gpt2"])
def test_every_trainable_parameter_changes_and_val_acc_counts_pairs(word_tokenizer_dir, cache_dir, tmp_path, backbone):
    pl.seed_everything(0)
    model = tiny_model(word_tokenizer_dir, backbone=backbone)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    dm = tiny_data(word_tokenizer_dir, cache_dir)
    trainer = quiet_trainer(str(tmp_path), limit_train_batches=3)  # 3 steps, then the epoch's validation
    trainer.fit(model, dm)
    unchanged = [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    assert unchanged == []
    model.eval()
    with torch.no_grad():  # val/acc is the share of validation pairs the final model ranks right, each pair once
        margins = torch.cat([model.pair_margins(b) for b in dm.val_dataloader()])
    assert len(margins) == 40
    assert float(trainer.callback_metrics["val/acc"]) == pytest.approx(float((margins > 0).float().mean()))


def test_teacher_learns_the_synthetic_source(word_tokenizer_dir, cache_dir, tmp_path):
    pl.seed_everything(0)
    dm = tiny_data(word_tokenizer_dir, cache_dir, source_options=synth_options(n_train=1200, n_test=300),
                   train_subset="teacher")
    model = tiny_model(word_tokenizer_dir)
    trainer = quiet_trainer(str(tmp_path), max_epochs=3)
    trainer.fit(model, dm)
    trainer.test(model, dm)
    acc = model.test_results
    # The source's artifact alone predicts 85% of its pairs; chance is 50%.
    assert acc[SOURCE]["acc"] > 0.75
    assert acc[SOURCE]["pairs"] == 300 and set(acc) == {SOURCE, *TARGETS}


def _fit_and_test(tok, cache, root, **trainer_kwargs):
    pl.seed_everything(7)
    model, dm = tiny_model(tok), tiny_data(tok, cache)
    trainer = quiet_trainer(root, max_epochs=2, **trainer_kwargs)
    trainer.fit(model, dm)
    trainer.test(model, dm, verbose=False)
    return model


def test_same_seed_gives_identical_metrics(word_tokenizer_dir, cache_dir, tmp_path):
    first = _fit_and_test(word_tokenizer_dir, cache_dir, str(tmp_path / "a"))
    second = _fit_and_test(word_tokenizer_dir, cache_dir, str(tmp_path / "b"))
    assert first.test_results == second.test_results
    for (n, p), (_, q) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(p, q), n


def test_resume_equals_uninterrupted(word_tokenizer_dir, cache_dir, tmp_path):
    full = _fit_and_test(word_tokenizer_dir, cache_dir, str(tmp_path / "full"))

    pl.seed_everything(7)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, save_top_k=0)
    quiet_trainer(str(tmp_path / "part"), max_epochs=1, enable_checkpointing=True, callbacks=[ckpt]).fit(
        tiny_model(word_tokenizer_dir), tiny_data(word_tokenizer_dir, cache_dir))
    pl.seed_everything(123)  # a resumed process does not share the first one's RNG state
    resumed, dm = tiny_model(word_tokenizer_dir), tiny_data(word_tokenizer_dir, cache_dir)
    trainer = quiet_trainer(str(tmp_path / "resumed"), max_epochs=2)
    trainer.fit(resumed, dm, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    trainer.test(resumed, dm, verbose=False)
    for (n, p), (_, q) in zip(full.named_parameters(), resumed.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), n
    for split, r in full.test_results.items():
        assert resumed.test_results[split]["acc"] == pytest.approx(r["acc"], abs=1e-9)


def test_tokenized_splits_are_cached_and_reused(word_tokenizer_dir, cache_dir, monkeypatch):
    first = tiny_data(word_tokenizer_dir, cache_dir)
    first.setup("fit")
    assert not any(v["cached"] for v in first.manifest["tokenization"].values())
    import datamodules.preference.datamodule as pd

    def boom(*a, **k):
        raise AssertionError("tokenized again although the cache was complete")

    monkeypatch.setattr(pd.PairTokenizer, "__call__", boom)
    second = tiny_data(word_tokenizer_dir, cache_dir)
    second.setup("fit")
    assert all(v["cached"] for v in second.manifest["tokenization"].values())
    assert second.datasets["validation"].cols == first.datasets["validation"].cols


def test_halves_are_disjoint_seeded_and_recorded(word_tokenizer_dir, cache_dir, tmp_path):
    dm = tiny_data(word_tokenizer_dir, cache_dir)
    trainer = quiet_trainer(str(tmp_path), max_steps=1, limit_val_batches=0,
                            logger=pl.loggers.CSVLogger(str(tmp_path)))
    trainer.fit(tiny_model(word_tokenizer_dir), dm)
    with open(os.path.join(trainer.log_dir, "splits.json")) as f:
        splits = json.load(f)
    teacher, student = set(splits["train_teacher"]), set(splits["train_student"])
    assert len(teacher) == len(student) == 120 and not teacher & student
    other = tiny_data(word_tokenizer_dir, cache_dir, seed=1)
    records, _ = other.load_records()
    assert {r["id"] for r in records["train_teacher"]} != teacher
    same, _ = tiny_data(word_tokenizer_dir, cache_dir).load_records()
    assert {r["id"] for r in same["train_teacher"]} == teacher
    manifest = json.load(open(os.path.join(trainer.log_dir, "data_manifest.json")))
    assert manifest["sizes"]["test/" + SOURCE] == 41


def test_teacher_source_options_change_only_the_teacher_half(word_tokenizer_dir, cache_dir):
    from datamodules.preference.synthetic_shift import has_artifact
    from tests.helpers import synth_options

    opts = synth_options(n_train=1000)
    base, _ = tiny_data(word_tokenizer_dir, cache_dir, source_options=opts).load_records()
    variant, _ = tiny_data(word_tokenizer_dir, cache_dir, source_options=opts,
                           teacher_source_options={"artifact_rate": 0.5}).load_records()
    assert variant["train_student"] == base["train_student"]
    assert [r["id"] for r in variant["train_teacher"]] == [r["id"] for r in base["train_teacher"]]

    def chosen_artifact_share(records):
        marked = [r for r in records if has_artifact("helpful", r["chosen"]) != has_artifact("helpful", r["rejected"])]
        return sum(has_artifact("helpful", r["chosen"]) for r in marked) / len(marked)

    assert chosen_artifact_share(base["train_teacher"]) == pytest.approx(0.85, abs=0.05)
    assert chosen_artifact_share(variant["train_teacher"]) == pytest.approx(0.5, abs=0.07)


def test_keep_layers_loads_the_pretrained_lower_layers():
    """keep_layers=k: a smaller model of the same family, whose embeddings and first k layers are the checkpoint's."""
    from lightning_modules.reward.reward_model import RewardModelModule

    full = RewardModelModule(backbone="minilm", pooling="mean")
    small = RewardModelModule(backbone="minilm", pooling="mean", keep_layers=2)
    assert len(small.backbone.encoder.layer) == 2 and small.backbone.config.num_hidden_layers == 2
    full_state = full.backbone.state_dict()
    for name, value in small.backbone.state_dict().items():
        assert torch.equal(value, full_state[name]), name
    assert any(name.startswith("encoder.layer.5.") for name in full_state)


def test_keep_layers_zero_is_a_bag_of_embeddings():
    """keep_layers=0: the pretrained embeddings alone; no token's state depends on another token."""
    from lightning_modules.reward.backbones import num_layers
    from lightning_modules.reward.reward_model import RewardModelModule

    model = RewardModelModule(backbone="minilm", pooling="mean", keep_layers=0).eval()
    assert num_layers(model.backbone) == 0 and len(model.backbone.encoder.layer) == 0
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    changed = ids.clone()
    changed[0, 2] = 2106
    mask = torch.ones_like(ids)
    with torch.no_grad():
        h, h_changed = (model.backbone(input_ids=x, attention_mask=mask).last_hidden_state for x in (ids, changed))
    keep = [0, 1, 3, 4, 5]
    torch.testing.assert_close(h[0, keep], h_changed[0, keep], rtol=0, atol=0)
    assert not torch.allclose(h[0, 2], h_changed[0, 2])
    with pytest.raises(ValueError, match=r"keep_layers must be in \[0, 6\]"):
        RewardModelModule(backbone="minilm", keep_layers=7)


def test_vocab_limit_reads_rare_tokens_as_unknown():
    """vocab_limit=k: ids >= k score exactly as the unknown token would; lower ids and special tokens are untouched."""
    from lightning_modules.reward.reward_model import RewardModelModule

    limited = RewardModelModule(backbone="minilm", pooling="mean", keep_layers=1, vocab_limit=3000).eval()
    full = RewardModelModule(backbone="minilm", pooling="mean", keep_layers=1).eval()
    full.load_state_dict(limited.state_dict())
    cls, sep, unk = 101, 102, 100
    ids = torch.tensor([[cls, 2023, 5121, 2003, 26223, sep]])  # 5121 "certainly" and 26223 are past the limit
    by_hand = torch.tensor([[cls, 2023, unk, 2003, unk, sep]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        h = limited.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        h_by_hand = full.backbone(input_ids=by_hand, attention_mask=mask).last_hidden_state
        h_unlimited = full.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(h, h_by_hand, rtol=0, atol=0)
    assert not torch.allclose(h, h_unlimited)
    for bad in (0, 10**6, 2.5):
        with pytest.raises(ValueError, match="vocab_limit must be an integer"):
            RewardModelModule(backbone="minilm", keep_layers=0, vocab_limit=bad)


@pytest.mark.parametrize("backbone, pooling", [("tiny-qwen2", "last"), ("tiny-llama", "last"), ("tiny-gpt2", "last"),
                                               ("tiny-gpt2", "mean"), ("minilm", "mean")])
def test_no_trainable_parameter_is_driven_by_noise(word_tokenizer_dir, cache_dir, backbone, pooling):
    """Pairwise objectives see rewards only through r(a) − r(b), and attention logits only up to a per-query constant:
    a parameter that shifts every reward alike (a head bias, a final LayerNorm's bias) or every key alike (a key bias
    without rotary embeddings) gets a gradient of pure float noise, which Adam turns into lr-sized steps. In float64
    every trainable parameter's gradient, and each third of GPT-2's fused q|k|v bias, must be a real signal or
    exactly 0, never rounding."""
    pl.seed_everything(0)
    tok = "minilm" if backbone == "minilm" else word_tokenizer_dir
    extra = dict(keep_layers=2) if backbone == "minilm" else {}
    model = tiny_model(tok, backbone=backbone, pooling=pooling, **extra).double()
    dm = tiny_data(tok, cache_dir)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    model.pair_margins(batch).sigmoid().log().neg().mean().backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad and p.grad is not None:  # BERT's pooler is unused: no gradient at all, never updated
            parts = p.grad.chunk(3) if name.endswith("c_attn.bias") else (p.grad,)
            grads.update({f"{name}[{i}]": g.abs().max().item() for i, g in enumerate(parts)})
    scale = max(grads.values())
    assert model.head.score.bias is None
    assert not [n for n, g in grads.items() if 0 < g < 1e-9 * scale], grads
    if backbone == "tiny-gpt2":  # the key third is exactly 0, the query and value thirds are real
        n_layers = model.backbone.config.n_layer
        assert [n for n, g in grads.items() if g == 0] == [f"backbone.h.{i}.attn.c_attn.bias[1]" for i in range(n_layers)]


@pytest.mark.parametrize("kwargs", [dict(center_rewards_coef=0.1), dict(anchor_coef=1.0)])
def test_final_norm_bias_trains_when_it_matters(word_tokenizer_dir, kwargs):
    """Reward centering sees absolute rewards and a last-layer anchor sees the final hidden state: there the final
    LayerNorm's bias has a real gradient and stays trainable."""
    assert tiny_model(word_tokenizer_dir, backbone="tiny-gpt2", **kwargs).backbone.ln_f.bias.requires_grad
    assert not tiny_model(word_tokenizer_dir, backbone="tiny-gpt2").backbone.ln_f.bias.requires_grad
