"""The frozen prefix run once (--model.share_frozen_prefix) and once per training sequence (--model.cache_frozen_prefix):
the same hidden states, losses, gradients and weights as the plain forward, no prefix forward after epoch 1 with the
cache, the reference's anchor target unchanged, a bounded cache, and clear refusals."""
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from callbacks.reference_model import FrozenReference, ReferenceModelCallback
from lightning_modules.fast.frozen_prefix import FrozenPrefix, check_supported, prefix_hidden, upper_hidden_states
from lightning_modules.reward.backbones import LoraSpec, build_backbone
from lightning_modules.reward.reward_model import _disable_dropout_everywhere, _embedding_modules, _transformer_layers
from tests.helpers import quiet_trainer, synth_options, tiny_data, tiny_model

THREE_LAYERS = {"num_hidden_layers": 3}


def _batch(vocab=100, left=False):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (4, 9), generator=g)  # (N, T)
    mask = torch.ones(4, 9, dtype=torch.long)
    for row, n in ((1, 6), (2, 3)):
        if left:
            mask[row, : 9 - n] = 0
        else:
            mask[row, n:] = 0
    return ids, mask


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama", "minilm"])
@pytest.mark.parametrize("left", [False, True])
def test_upper_layers_from_hidden_state_k_equal_the_full_forward(name, left):
    torch.manual_seed(0)
    if name == "minilm":
        backbone = build_backbone("minilm", 30522, 0, keep_layers=3).eval()
        _disable_dropout_everywhere(backbone)  # what the module does by default; a prefix with dropout is refused
    else:
        backbone = build_backbone(name, 100, 0, THREE_LAYERS)
    backbone.requires_grad_(False)  # a frozen prefix (and here everything above it too)
    ids, mask = _batch(left=left)
    full = backbone(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    for k in (1, 2):
        plain, cached = FrozenPrefix(backbone, k), FrozenPrefix(backbone, k, cache=True)
        for h_k in (plain(ids, mask), cached(ids, mask), cached(ids, mask)):  # plain, stored, read back
            states = upper_hidden_states(backbone, cached.family, k, h_k, mask)
            assert len(states) == len(full.hidden_states) == 4 and states[:k] == (None,) * k
            for i in range(k, 4):
                torch.testing.assert_close(states[i][real], full.hidden_states[i][real], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(states[-1][real], full.last_hidden_state[real], rtol=1e-5, atol=1e-6)
        assert cached.stored_rows == 4 and cached.prefix_forwards == 4


def test_reference_anchor_target_is_unchanged_by_the_shared_prefix():
    torch.manual_seed(0)
    backbone = build_backbone("tiny-qwen2", 100, 0, THREE_LAYERS).requires_grad_(False)
    ref_cb = ReferenceModelCallback()
    ref_cb.reference = FrozenReference(backbone)
    ids, mask = _batch()
    select = mask.clone()
    select[:, :2] = 0  # (N, T): "response" tokens only
    h_k = prefix_hidden(backbone, "decoder", 1, ids, mask)
    plain = ref_cb.selected_hidden_states(ids, mask, select, [2, 3])
    shared = ref_cb.selected_hidden_states(ids, mask, select, [2, 3], prefix=("decoder", 1, h_k))
    for p, s in zip(plain, shared):
        assert p.shape == s.shape and p.shape[0] == int(select.sum())
        torch.testing.assert_close(s, p, rtol=1e-5, atol=1e-6)


class Recorder(Callback):
    """Per-step loss and gradient, and calls of the student's and the reference's frozen prefix, per epoch."""

    def __init__(self, k):
        self.k, self.losses, self.grads, self.prefix_calls = k, [], [], []

    def on_train_start(self, trainer, pl_module):
        ref_cb = next(cb for cb in trainer.callbacks if isinstance(cb, ReferenceModelCallback))
        models = [pl_module.backbone] + ([ref_cb.reference.model] if ref_cb.reference is not None else [])
        for who, model in enumerate(models):
            for module in [model.get_input_embeddings(), *_transformer_layers(model)[: self.k]]:
                module.register_forward_hook(
                    lambda m, i, o, who=who: self.prefix_calls.append((who, trainer.current_epoch)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append(torch.cat([p.grad.flatten() for p in pl_module.parameters() if p.grad is not None]))


def _fit(tok, cache_dir, root, backbone, anchor_coef, **prefix_flags):
    pl.seed_everything(0)
    if backbone == "minilm":  # the shipped encoder, cut to 3 layers, mean pooling (the W2S student's family)
        buckets = prefix_flags.get("length_buckets", 1)
        model = tiny_model("minilm", backbone="minilm", keep_layers=3, pooling="mean", anchor_coef=anchor_coef,
                           anchor_layers=[0.67, 1.0], freeze_layers=1, length_buckets=buckets)
        if prefix_flags:
            model.frozen_prefix = FrozenPrefix(model.backbone, 1, cache=prefix_flags.get("cache_frozen_prefix", False),
                                               buckets=buckets)
        tok = "minilm"
    else:  # plain = one full forward (no last-token shortcut)
        model = tiny_model(tok, backbone=backbone, tiny_config=THREE_LAYERS, last_token_scoring=False,
                           anchor_coef=anchor_coef, anchor_layers=[0.67, 1.0], freeze_layers=1, **prefix_flags)
    rec = Recorder(k=1)
    trainer = quiet_trainer(root, max_epochs=2, limit_val_batches=0, callbacks=[ReferenceModelCallback(), rec])
    data = tiny_data(tok, cache_dir, train_subset="student", max_length=48, batch_size=8,
                     source_options=synth_options(n_train=96))
    trainer.fit(model, data)  # reshuffled every epoch: regrouped batches
    return rec, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("backbone,anchor_coef", [  # without the anchor: make test-slow (the fast suite's budget)
    pytest.param("tiny-qwen2", 0.0, marks=pytest.mark.slow), ("tiny-qwen2", 100.0), ("minilm", 100.0)])
def test_shared_and_cached_prefix_train_exactly_like_the_plain_forward(word_tokenizer_dir, cache_dir, tmp_path,
                                                                        backbone, anchor_coef):
    fit = lambda name, **flags: _fit(word_tokenizer_dir, cache_dir, str(tmp_path / name), backbone, anchor_coef,
                                     **flags)
    plain, plain_w = fit("plain")
    steps = len(plain.losses) // 2
    assert steps >= 4 and len(plain.losses) == 2 * steps
    with_reference = 2 if anchor_coef > 0 else 1
    # embeddings + layer 1 once per step for the student, and once more for the reference when anchored
    assert len(plain.prefix_calls) == 2 * with_reference * 2 * steps
    for flags in ({"share_frozen_prefix": True}, {"cache_frozen_prefix": True},
                  {"cache_frozen_prefix": True, "length_buckets": 3}):  # the upper layers in length buckets
        rec, weights = fit(next(iter(flags)), **flags)
        torch.testing.assert_close(torch.tensor(rec.losses), torch.tensor(plain.losses), rtol=1e-4, atol=1e-6)
        for g, g_plain in zip(rec.grads, plain.grads, strict=True):
            torch.testing.assert_close(g, g_plain, rtol=1e-3, atol=1e-5 * float(g_plain.abs().max()))
        for k in plain_w:
            torch.testing.assert_close(weights[k], plain_w[k], rtol=1e-4, atol=5e-5)
        assert all(who == 0 for who, _ in rec.prefix_calls)  # the reference never runs its prefix
        per_epoch = [sum(1 for _, e in rec.prefix_calls if e == epoch) for epoch in (0, 1)]
        if "length_buckets" in flags:  # the store is the process's: the previous fit (same prefix) filled it
            assert per_epoch == [0, 0]
        else:
            assert per_epoch == ([2 * steps, 0] if "cache_frozen_prefix" in flags else [2 * steps, 2 * steps])


def test_prefix_cache_stops_at_its_budget_with_one_warning():
    torch.manual_seed(0)
    backbone = build_backbone("tiny-qwen2", 100, 0, THREE_LAYERS).requires_grad_(False)
    ids, mask = _batch()
    row_bytes = 9 * 64 * 4  # a full row: 9 real positions × hidden 64 × fp32
    prefix = FrozenPrefix(backbone, 1, cache=True, max_mb=1.5 * row_bytes / 2 ** 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = prefix(ids, mask)
        again = prefix(ids, mask)
    assert prefix.stored_rows == 1 and prefix.store.bytes == row_bytes  # row "a" (9 positions) fits, "b" (6) closes the cache
    assert sum("--model.prefix_cache_max_mb" in str(w.message) for w in caught) == 1
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(first[mask.bool()], prefix_hidden(backbone, "decoder", 1, ids, mask)[mask.bool()])


def test_unsupported_combinations_are_refused_naming_the_flag(word_tokenizer_dir):
    model = tiny_model("minilm", backbone="minilm", keep_layers=2, freeze_layers=1)
    model.backbone.embeddings.position_embeddings.requires_grad_(True)
    with pytest.raises(ValueError, match="--model.share_frozen_prefix.*trainable parameters.*position_embeddings"):
        check_supported(model.backbone, 1)
    with pytest.raises(ValueError, match="--model.share_frozen_prefix.*not GPT2Model"):
        tiny_model(word_tokenizer_dir, backbone="tiny-gpt2", freeze_layers=1, share_frozen_prefix=True)
    with pytest.raises(ValueError, match=r"--model.freeze_layers in \[1, 1\]"):
        tiny_model(word_tokenizer_dir, cache_frozen_prefix=True)
    with pytest.raises(ValueError, match="--model.cache_frozen_prefix do not support --model.lora"):
        tiny_model(word_tokenizer_dir, freeze_layers=1, cache_frozen_prefix=True, lora=LoraSpec(r=4))
    with pytest.raises(ValueError, match="--model.gradient_checkpointing"):
        tiny_model(word_tokenizer_dir, freeze_layers=1, share_frozen_prefix=True, gradient_checkpointing=True)
    with pytest.raises(ValueError, match="--model.prefix_cache_max_mb"):
        tiny_model(word_tokenizer_dir, freeze_layers=1, cache_frozen_prefix=True, prefix_cache_max_mb=-1)


@pytest.mark.parametrize("backbone", ["minilm", "tiny-gpt2", "tiny-qwen2"])
def test_freeze_layers_freezes_everything_below_the_first_trainable_layer(word_tokenizer_dir, backbone):
    kwargs = dict(backbone="minilm", keep_layers=2) if backbone == "minilm" else dict(backbone=backbone)
    model = tiny_model("minilm" if backbone == "minilm" else word_tokenizer_dir, freeze_layers=1, **kwargs)
    below = [*_embedding_modules(model.backbone), _transformer_layers(model.backbone)[0]]
    names = {id(p) for m in below for p in m.parameters()}
    assert len(names) > 0
    for name, p in model.backbone.named_parameters():
        if id(p) in names:
            assert not p.requires_grad, name  # BERT's positions / token types / embedding LayerNorm included
    assert any(p.requires_grad for p in _transformer_layers(model.backbone)[1].parameters())
    if backbone == "minilm":
        assert {"embeddings.position_embeddings.weight", "embeddings.LayerNorm.weight"} <= {
            n for n, p in model.backbone.named_parameters() if id(p) in names}
    if backbone == "tiny-gpt2":
        assert not model.backbone.wpe.weight.requires_grad
