"""The process-wide stores (lightning_modules/fast/shared_store.py). The frozen prefix's (--model.cache_frozen_prefix):
validation, test and the drift probes read it with the same results as the full forward; every module with the same
frozen prefix shares it (each sequence's prefix computed once), a different prefix (weights, vocabulary limit) gets
its own, and a prefix with dropout is refused. The ANCHOR reference's (--reference.cache_outputs): a second fit
above the same initial weights reads every reference state and trains exactly as alone."""
import pytest
import torch

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from callbacks.drift import DriftDiagnosticsCallback
from callbacks.reference_model import ReferenceModelCallback
from lightning_modules.fast.shared_store import release_shared_stores, shared_store_bytes
from tests.helpers import quiet_trainer, synth_options, tiny_data, tiny_model

THREE_LAYERS = {"num_hidden_layers": 3}


def _model(tok, **kwargs):
    pl.seed_everything(0)
    return tiny_model(tok, tiny_config=THREE_LAYERS, freeze_layers=1, **kwargs)


def _margins(model, data):
    return torch.cat([model.pair_margins(b) for b in data.test_dataloader()[1]])


@pytest.mark.parametrize("buckets", [1, 3])
def test_evaluation_through_the_store_equals_the_full_forward_and_is_shared(word_tokenizer_dir, cache_dir, tmp_path,
                                                                            buckets):
    data = tiny_data(word_tokenizer_dir, cache_dir)
    plain = _model(word_tokenizer_dir).eval()
    cached = _model(word_tokenizer_dir, cache_frozen_prefix=True, length_buckets=buckets).eval()
    cached.load_state_dict(plain.state_dict())
    results = {}
    for name, model in (("plain", plain), ("cached", cached)):
        quiet_trainer(str(tmp_path / name)).test(model, data, verbose=False)
        results[name] = {split: r["acc"] for split, r in model.test_results.items()}
    assert results["cached"] == results["plain"]
    with torch.no_grad():
        torch.testing.assert_close(_margins(cached, data), _margins(plain, data), rtol=1e-5, atol=1e-5)
    test_rows = 2 * sum(len(data.datasets[f"test/{s}"]) for s in [data.source, *data.ood_targets])
    assert cached.frozen_prefix.prefix_forwards == cached.frozen_prefix.stored_rows <= test_rows  # each sequence once
    stored = shared_store_bytes()
    assert stored > 0

    again = _model(word_tokenizer_dir, cache_frozen_prefix=True)  # another stage above the same frozen prefix
    quiet_trainer(str(tmp_path / "again")).test(again, data, verbose=False)
    assert again.frozen_prefix.prefix_forwards == 0 and shared_store_bytes() == stored
    assert {split: r["acc"] for split, r in again.test_results.items()} == results["plain"]

    other = {k: v.clone() for k, v in plain.state_dict().items()}
    other["backbone.embed_tokens.weight"] += 0.01  # another prefix: loading it re-fingerprints, nothing is reused
    again.load_state_dict(other)
    quiet_trainer(str(tmp_path / "other")).test(again, data, verbose=False)
    assert again.frozen_prefix.prefix_forwards == cached.frozen_prefix.prefix_forwards
    assert shared_store_bytes() == 2 * stored


def test_drift_through_the_store_equals_the_plain_drift(word_tokenizer_dir, cache_dir, tmp_path):
    runs = {}
    for cache in (False, True):
        cb = DriftDiagnosticsCallback(probe_pairs=8, layers=[0.67, 1.0], batch_size=4)
        model = _model(word_tokenizer_dir, cache_frozen_prefix=cache)
        whole = []  # whole-backbone forwards (the hook is copied into the drift's reference along with the backbone)
        model.backbone.register_forward_hook(lambda m, i, o: whole.append(1))
        trainer = quiet_trainer(str(tmp_path / str(cache)), max_steps=4, limit_val_batches=1, val_check_interval=2,
                                callbacks=[cb, ReferenceModelCallback()])
        pl.seed_everything(0)
        trainer.fit(model, tiny_data(word_tokenizer_dir, cache_dir))
        runs[cache] = (cb, model, len(whole))
    (plain, _, plain_whole), (cached, model, cached_whole) = runs[False], runs[True]
    assert plain_whole > 0 and cached_whole == 0  # training, validation and both drift passes read the store
    assert cached.layer_ids == [2, 3] and [h["step"] for h in cached.history] == [0, 2, 4]
    for h_plain, h_cached in zip(plain.history, cached.history, strict=True):
        for split, metrics in h_plain["drift"].items():
            for metric, layers in metrics.items():
                for layer, value in layers.items():
                    assert h_cached["drift"][split][metric][layer] == pytest.approx(value, rel=1e-4, abs=1e-7)
    assert cached.final_drift[cached.id_split]["mse"]["layer3"] > 1e-6  # it did train
    # training rows, validation rows and probe rows: each sequence's prefix computed once in the whole fit
    assert model.frozen_prefix.prefix_forwards == model.frozen_prefix.stored_rows > 0


def test_a_prefix_with_dropout_is_refused():
    with pytest.raises(ValueError, match="applies dropout.*--model.disable_dropout"):
        tiny_model("minilm", backbone="minilm", keep_layers=2, freeze_layers=1, cache_frozen_prefix=True,
                   disable_dropout=False)


def test_a_vocabulary_limit_is_another_prefix():
    plain = tiny_model("minilm", backbone="minilm", keep_layers=2, freeze_layers=1, cache_frozen_prefix=True)
    limited = tiny_model("minilm", backbone="minilm", keep_layers=2, freeze_layers=1, cache_frozen_prefix=True,
                         vocab_limit=14000)
    same = tiny_model("minilm", backbone="minilm", keep_layers=2, freeze_layers=1, cache_frozen_prefix=True)
    fingerprints = [m.frozen_prefix.current_fingerprint() for m in (plain, limited, same)]
    assert fingerprints[0] == fingerprints[2] != fingerprints[1]


class _Losses(Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def test_anchor_fits_with_the_same_reference_share_its_states(word_tokenizer_dir, cache_dir, tmp_path):
    """--reference.cache_outputs with a copied reference: a second ANCHOR fit above the same initial weights (the
    next λ of a sweep) runs the reference for no row and trains exactly as the first; other weights get their own."""
    runs = {}
    for run, init_seed in (("first", 0), ("second", 0), ("other weights", 1)):
        pl.seed_everything(init_seed)
        model = tiny_model(word_tokenizer_dir, tiny_config=THREE_LAYERS, freeze_layers=1, cache_frozen_prefix=True,
                           anchor_coef=100.0 if run == "first" else 1.0, anchor_layers=[0.67, 1.0])
        ref_cb, rec = ReferenceModelCallback(cache_outputs=True), _Losses()
        trainer = quiet_trainer(str(tmp_path / run), max_epochs=2, limit_val_batches=0, callbacks=[ref_cb, rec])
        pl.seed_everything(0)
        trainer.fit(model, tiny_data(word_tokenizer_dir, cache_dir, max_length=48, batch_size=8,
                                     source_options=synth_options(n_train=96)))
        runs[run] = (ref_cb.reference_rows, rec.losses, len(rec.losses))
    rows_first, _, steps = runs["first"]
    assert rows_first > 0 and runs["second"][0] == 0  # every reference state read back from the first fit's
    assert runs["other weights"][0] == rows_first  # another initial model: its own store, every row computed once
    assert runs["second"][2] == steps

    pl.seed_everything(0)  # the second fit's losses = a fit that computes its own reference states
    release_shared_stores()
    model = tiny_model(word_tokenizer_dir, tiny_config=THREE_LAYERS, freeze_layers=1, cache_frozen_prefix=True,
                       anchor_coef=1.0, anchor_layers=[0.67, 1.0])
    rec = _Losses()
    trainer = quiet_trainer(str(tmp_path / "alone"), max_epochs=2, limit_val_batches=0,
                            callbacks=[ReferenceModelCallback(cache_outputs=True), rec])
    pl.seed_everything(0)
    trainer.fit(model, tiny_data(word_tokenizer_dir, cache_dir, max_length=48, batch_size=8,
                                 source_options=synth_options(n_train=96)))
    torch.testing.assert_close(torch.tensor(runs["second"][1]), torch.tensor(rec.losses), rtol=1e-5, atol=1e-7)
