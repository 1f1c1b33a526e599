"""The reference's hidden states at the anchored positions only (lightning_modules/fast/selected_positions.py): the
rows of the full forward's `hidden_states[l][select]`, from the embeddings or from a shared frozen prefix, through
the callback with and without its cache, and two anchored fits with the same losses and weights as the full
forward's."""
import lightning.pytorch as pl
import pytest
import torch

import lightning_modules.fast.selected_positions as sp
from callbacks.reference_model import FrozenReference, ReferenceModelCallback
from lightning_modules.fast.frozen_prefix import FrozenPrefix, prefix_hidden
from lightning_modules.fast.selected_positions import selected_hidden_states, selected_positions_family
from lightning_modules.reward.backbones import build_backbone
from tests.helpers import quiet_trainer, synth_options, tiny_data, tiny_model

THREE_LAYERS = {"num_hidden_layers": 3}


def _backbone(name):
    torch.manual_seed(0)
    if name == "minilm":
        return build_backbone("minilm", 30522, 0, keep_layers=3).eval().requires_grad_(False)
    return build_backbone(name, 100, 0, THREE_LAYERS).requires_grad_(False)


def _batch(left):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (4, 9), generator=g)  # (N, T)
    mask = torch.ones(4, 9, dtype=torch.long)
    select = torch.zeros(4, 9, dtype=torch.bool)
    for row, (n, prompt) in enumerate(((9, 3), (6, 2), (3, 1), (9, 8))):  # real tokens, prompt tokens per row
        real = slice(9 - n, 9) if left else slice(0, n)
        mask[row] = 0
        mask[row, real] = 1
        start = real.start + prompt
        select[row, start:real.stop] = True  # the response: the tail of the real tokens
    return ids, mask, select


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama", "minilm"])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("layer_ids", [[3], [2, 3], [2], [1, 2]])
def test_selected_states_are_the_full_forwards_rows(name, left, layer_ids):
    backbone = _backbone(name)
    family = selected_positions_family(backbone)
    assert family == ("encoder" if name == "minilm" else "decoder")
    ids, mask, select = _batch(left)
    full = backbone(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    got = selected_hidden_states(backbone, family, ids, mask, select, layer_ids)
    assert len(got) == len(layer_ids)
    for l, g in zip(layer_ids, got):
        assert g.shape == (int(select.sum()), full[l].shape[-1])
        torch.testing.assert_close(g, full[l][select], rtol=1e-5, atol=1e-5)
    h_1 = prefix_hidden(backbone, family, 1, ids, mask)  # a shared frozen prefix: layers 2.. only
    from_prefix = selected_hidden_states(backbone, family, ids, mask, select, layer_ids, h_1, 1)
    for l, g in zip(layer_ids, from_prefix):
        torch.testing.assert_close(g, full[l][select], rtol=1e-5, atol=1e-5)


def test_unsupported_backbones_and_bad_layers():
    assert selected_positions_family(build_backbone("tiny-gpt2", 100, 0, THREE_LAYERS)) is None
    backbone = _backbone("tiny-qwen2")
    ids, mask, select = _batch(False)
    with pytest.raises(ValueError, match="must be >= the prefix layer 2"):
        selected_hidden_states(backbone, "decoder", ids, mask, select, [1, 3],
                               prefix_hidden(backbone, "decoder", 2, ids, mask), 2)


@pytest.mark.parametrize("name", ["tiny-qwen2", "minilm"])
@pytest.mark.parametrize("cache", [False, True])
def test_callback_gives_the_full_forwards_rows(name, cache):
    backbone = _backbone(name)
    ref_cb = ReferenceModelCallback(cache_outputs=cache)
    ref_cb.reference = FrozenReference(backbone)
    ids, mask, select = _batch(False)
    full = backbone(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    keys = ["a", "b", "c", "d"]
    family = selected_positions_family(backbone)
    prefix = (family, 1, prefix_hidden(backbone, family, 1, ids, mask))
    # twice: with the cache the second call reads every row back (in another row order)
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        o = torch.tensor(order)
        for p in (None, (*prefix[:2], prefix[2][o])):
            got = ref_cb.selected_hidden_states(ids[o], mask[o], select[o], [2, 3], [keys[i] for i in order], p)
            for l, g in zip([2, 3], got):
                torch.testing.assert_close(g, full[l][o][select[o]], rtol=1e-5, atol=1e-5)
    assert len(ref_cb._cache) == (4 if cache else 0)


@pytest.mark.parametrize("name", ["tiny-qwen2", "minilm"])
def test_callback_in_length_buckets_gives_the_same_rows(name, monkeypatch):
    """--model.length_buckets: the reference's pass over a right-padded batch as a few trimmed forwards."""
    backbone = _backbone(name)
    ref_cb = ReferenceModelCallback()
    ref_cb.reference = FrozenReference(backbone)
    g = torch.Generator().manual_seed(0)
    lengths = [120, 14, 110, 9, 60, 30]
    ids = torch.randint(1, 100, (6, 120), generator=g)
    mask = (torch.arange(120).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()  # (6, 120), right-padded
    select = mask.bool() & (torch.arange(120).unsqueeze(0) >= 4)  # the response: after a 4-token prompt
    family = selected_positions_family(backbone)
    prefix = (family, 1, prefix_hidden(backbone, family, 1, ids, mask))
    calls = []
    original = sp.selected_hidden_states
    monkeypatch.setattr(sp, "selected_hidden_states", lambda *a, **kw: calls.append(a[3].shape) or original(*a, **kw))
    for p in (None, prefix):
        plain = ref_cb.selected_hidden_states(ids, mask, select, [2, 3], prefix=p)
        calls.clear()
        bucketed = ref_cb.selected_hidden_states(ids, mask, select, [2, 3], prefix=p, buckets=3)
        assert len(calls) == 3 and max(c[1] for c in calls) == 120 and min(c[1] for c in calls) < 60  # trimmed
        for a, b in zip(plain, bucketed, strict=True):
            assert a.shape == b.shape == (int(select.sum()), a.shape[-1])
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def _fit(tok, cache_dir, root, backbone, full_forward, monkeypatch):
    if full_forward:  # the reference's full forward, as before the selected-positions path
        monkeypatch.setattr(sp, "selected_positions_family", lambda model: None)
    pl.seed_everything(0)
    if backbone == "minilm":  # the W2S student's setting: shared + cached frozen prefix, reference cache
        model = tiny_model("minilm", backbone="minilm", keep_layers=3, pooling="mean", anchor_coef=100.0,
                           freeze_layers=1, cache_frozen_prefix=True)
        tok = "minilm"
    else:  # the full copy, anchored on an intermediate and the last layer
        model = tiny_model(tok, backbone=backbone, tiny_config=THREE_LAYERS, anchor_coef=10.0,
                           anchor_layers=[0.67, 1.0])
    losses = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(trainer.callback_metrics["train/anchor_loss"]))

    trainer = quiet_trainer(root, max_epochs=2, limit_val_batches=0,
                            callbacks=[ReferenceModelCallback(cache_outputs=True), Record()])
    trainer.fit(model, tiny_data(tok, cache_dir, train_subset="student", max_length=48, batch_size=8,
                                 source_options=synth_options(n_train=64)))
    monkeypatch.undo()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("backbone", ["tiny-qwen2", "minilm"])
def test_anchored_fit_equals_the_full_reference_forward(word_tokenizer_dir, cache_dir, tmp_path, backbone,
                                                         monkeypatch):
    full, full_w = _fit(word_tokenizer_dir, cache_dir, str(tmp_path / "full"), backbone, True, monkeypatch)
    fast, fast_w = _fit(word_tokenizer_dir, cache_dir, str(tmp_path / "fast"), backbone, False, monkeypatch)
    assert len(full) >= 4 and max(full) > 0
    torch.testing.assert_close(torch.tensor(fast), torch.tensor(full), rtol=1e-4, atol=1e-7)
    for k in full_w:
        torch.testing.assert_close(fast_w[k], full_w[k], rtol=1e-4, atol=5e-5)
