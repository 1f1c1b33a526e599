"""Drift diagnostics: the pure measures on hand-computed values; the callback is exactly 0 at the start, moves with
training, reuses the ANCHOR reference instead of copying, survives a resume, and writes drift.json."""
import csv
import json
import math
import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from callbacks import drift as drift_module
from callbacks.drift import DriftDiagnosticsCallback, flat_drift
from callbacks.reference_model import ReferenceModelCallback
from lightning_modules.reward.drift_metrics import linear_cka, masked_cosine, pooled_response
from tests.helpers import SOURCE, TARGETS, quiet_trainer, tiny_data, tiny_model

SPLITS = [SOURCE, *TARGETS]


# ---- the pure measures --------------------------------------------------------------------------------------
def test_cka_is_one_under_orthogonal_maps_scaling_and_shifts():
    torch.manual_seed(0)
    for n, d in [(10, 4), (5, 12)]:  # both the feature and the Gram computation
        x = torch.randn(n, d)
        q, _ = torch.linalg.qr(torch.randn(d, d))
        assert float(linear_cka(x, x)) == pytest.approx(1.0, abs=1e-12)
        assert float(linear_cka(x, x @ q)) == pytest.approx(1.0, abs=1e-10)
        assert float(linear_cka(x, 3.7 * x + 5.0)) == pytest.approx(1.0, abs=1e-10)
        # A non-isotropic scaling changes the representation's geometry: CKA drops below 1.
        assert float(linear_cka(x, x * torch.linspace(0.1, 3.0, d))) < 0.99


def test_cka_hand_computed():
    # 1-D: CKA is the squared Pearson correlation. Centred x = (-1, 0, 1), y = (-1, 1, 0): 1² / (2·2).
    x1, y1 = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[1.0], [3.0], [2.0]])
    assert float(linear_cka(x1, y1)) == pytest.approx(0.25)
    # Centred X (3×2), Y (3×1): ||YᵀX||² = ||(2, 1)||² = 5; ||XᵀX||_F = ||[[2,1],[1,2]]||_F = √10; ||YᵀY|| = 2.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    y = torch.tensor([[1.0], [0.0], [-1.0]])
    assert float(linear_cka(x, y)) == pytest.approx(5.0 / (2.0 * math.sqrt(10.0)))
    assert float(linear_cka(y, x)) == pytest.approx(5.0 / (2.0 * math.sqrt(10.0)))


def _cka_by_definition(x, y):
    xc, yc = x - x.mean(0), y - y.mean(0)
    return (yc.T @ xc).pow(2).sum() / ((xc.T @ xc).norm() * (yc.T @ yc).norm())


def test_cka_gram_and_feature_forms_agree_with_the_definition():
    torch.manual_seed(1)
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    for n in (6, 4):  # N > D: feature form; N < D: Gram form
        assert float(linear_cka(x[:n], y[:n])) == pytest.approx(float(_cka_by_definition(x[:n], y[:n])), rel=1e-12)
    with pytest.raises(ValueError):
        linear_cka(x[:1], y[:1])
    assert math.isnan(float(linear_cka(torch.ones(4, 3), x[:4])))  # no variance: undefined


def test_masked_cosine_hand_values():
    h = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [9.0, -9.0]]])  # (1, 3, 2); the last token is padding
    ref = torch.tensor([[[0.0, 1.0], [2.0, 2.0], [1.0, 1.0]]])
    assert float(masked_cosine(h, ref, torch.tensor([[1, 1, 0]]))) == pytest.approx(0.5)  # (0 + 1) / 2
    assert float(masked_cosine(h, ref, torch.tensor([[0, 1, 0]]))) == pytest.approx(1.0)  # scale-invariant
    assert float(masked_cosine(h, h, torch.tensor([[1, 1, 1]]))) == pytest.approx(1.0)
    assert float(masked_cosine(h, -h, torch.tensor([[1, 1, 1]]))) == pytest.approx(-1.0)
    assert math.isnan(float(masked_cosine(h, ref, torch.zeros(1, 3))))


def test_pooled_response_hand_values():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[1.0, 1.0], [7.0, 7.0], [0.0, 0.0]]])  # (2, 3, 2)
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    assert torch.equal(pooled_response(h, mask), torch.tensor([[4.0, 5.0], [1.0, 1.0]]))


# ---- the callback -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> str:
    """One tokenized cache for the whole module: tokenizing the splits costs more than the tiny fits."""
    return str(tmp_path_factory.mktemp("drift_cache"))


def _fit(tok, cache, root, callbacks, max_steps=4, logger=False, ckpt_path=None, seed=0, **model_kwargs):
    pl.seed_everything(seed)
    model = tiny_model(tok, **model_kwargs)
    trainer = quiet_trainer(root, max_steps=max_steps, limit_val_batches=1, val_check_interval=2, logger=logger,
                            callbacks=callbacks)
    trainer.fit(model, tiny_data(tok, cache), ckpt_path=ckpt_path)
    return trainer, model


def _assert_no_drift(drift):
    for split in SPLITS:
        for layer, mse in drift[split]["mse"].items():
            assert mse == 0.0, (split, layer)
            assert drift[split]["cosine"][layer] == pytest.approx(1.0, abs=1e-6)
            assert drift[split]["cka"][layer] == pytest.approx(1.0, abs=1e-9)


def test_drift_is_zero_at_start_and_grows_with_training(word_tokenizer_dir, shared_cache, tmp_path):
    cb = DriftDiagnosticsCallback(probe_pairs=8, layers=[0.5, 1.0], batch_size=4)
    ref_cb = ReferenceModelCallback()  # present but disabled (anchor_coef 0): the drift callback copies
    trainer, _ = _fit(word_tokenizer_dir, shared_cache, str(tmp_path), [cb, ref_cb], logger=CSVLogger(str(tmp_path)))
    assert ref_cb.reference is None and cb.layer_ids == [1, 2]
    assert [h["step"] for h in cb.history] == [0, 2, 4]  # start, then every validation
    first, final = cb.history[0]["drift"], cb.final_drift
    _assert_no_drift(first)
    assert set(final) == set(SPLITS)
    for split in SPLITS:
        for layer in ("layer1", "layer2"):
            assert final[split]["mse"][layer] > 1e-6
            assert final[split]["cosine"][layer] < 1.0 - 1e-6
            assert final[split]["cka"][layer] < 1.0 - 1e-6
    assert cb.probe_info[SOURCE] == {"from": "validation", "pairs": 8}

    # Logged under drift/<split>/<metric>/layer<k>, at the steps measured.
    with open(os.path.join(trainer.log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    key = f"drift/{TARGETS[0]}/cka/layer2"
    logged = {int(r["step"]): float(r[key]) for r in rows if r.get(key)}
    assert sorted(logged) == [0, 2, 4] and logged[4] == pytest.approx(final[TARGETS[0]]["cka"]["layer2"])

    with open(os.path.join(trainer.log_dir, "drift.json")) as f:
        written = json.load(f)
    assert {"step", "id_split", "ood_splits", "probes", "layers", "final", "summary", "history"} <= set(written)
    assert written["step"] == 4 and written["id_split"] == SOURCE and written["ood_splits"] == TARGETS
    assert written["layers"] == {"layer1": 0.5, "layer2": 1.0}
    assert written["final"] == final
    ood_mse = sum(final[t]["mse"]["layer2"] for t in TARGETS) / len(TARGETS)
    assert written["summary"]["ood_mean"]["mse"]["layer2"] == pytest.approx(ood_mse)
    assert written["summary"]["id"] == final[SOURCE]
    assert set(flat_drift(final)) == {f"drift/{s}/{m}/layer{k}" for s in SPLITS for m in ("mse", "cosine", "cka")
                                      for k in (1, 2)}


def test_cached_reference_states_give_the_same_drift_with_one_reference_pass(word_tokenizer_dir, shared_cache,
                                                                               tmp_path):
    runs = {}
    for cache in (False, True):
        cb = DriftDiagnosticsCallback(probe_pairs=8, layers=[0.5, 1.0], batch_size=4, cache_reference=cache)
        _fit(word_tokenizer_dir, shared_cache, str(tmp_path / str(cache)), [cb, ReferenceModelCallback()])
        runs[cache] = cb
    plain, cached = runs[False], runs[True]
    assert [h["step"] for h in cached.history] == [h["step"] for h in plain.history] == [0, 2, 4]
    for h_plain, h_cached in zip(plain.history, cached.history):
        for split, metrics in h_plain["drift"].items():
            for metric, layers in metrics.items():
                for layer, value in layers.items():
                    assert h_cached["drift"][split][metric][layer] == pytest.approx(value, rel=1e-5, abs=1e-9)
    assert not cached._reference_states  # released at teardown


def test_the_reference_runs_once_per_probe_batch_with_the_cache(word_tokenizer_dir, shared_cache, tmp_path,
                                                                monkeypatch):
    cb = DriftDiagnosticsCallback(probe_pairs=8, layers=[1.0], batch_size=4)
    calls = []
    original = DriftDiagnosticsCallback._reference_batch

    def counting(self, name, b, inputs, mask):
        calls.append((name, b, (name, b) in self._reference_states))
        return original(self, name, b, inputs, mask)

    student_passes = []
    original_states = DriftDiagnosticsCallback._hidden_states

    def counting_student(self, model, inputs):
        student_passes.append(1)
        return original_states(self, model, inputs)

    monkeypatch.setattr(DriftDiagnosticsCallback, "_reference_batch", counting)
    monkeypatch.setattr(DriftDiagnosticsCallback, "_hidden_states", counting_student)
    _fit(word_tokenizer_dir, shared_cache, str(tmp_path), [cb, ReferenceModelCallback()])
    first = [(name, b) for name, b, was_cached in calls if not was_cached]  # the reference ran for these
    assert len(first) == len(set(first)) == 2 * len(SPLITS)  # 8 probe pairs in batches of 4, per split
    assert len(calls) == 3 * len(first)  # measured at steps 0, 2 and 4
    # at step 0 the student still has the reference's weights: its states are the reference's, no forward
    assert len(student_passes) == 2 * len(first)


def test_the_probe_set_is_the_first_pairs_in_record_order(word_tokenizer_dir, shared_cache, tmp_path):
    cb = DriftDiagnosticsCallback(probe_pairs=5, measure_at_start=False)
    pl.seed_everything(0)
    dm = tiny_data(word_tokenizer_dir, shared_cache)
    trainer = quiet_trainer(str(tmp_path), max_steps=1, limit_val_batches=0, callbacks=[cb])
    trainer.fit(tiny_model(word_tokenizer_dir), dm)
    assert cb.layer_ids == [2]  # default: the anchored layer (last) of the 2-layer tiny model
    for split, kind in [(SOURCE, "validation"), *[(t, f"test/{t}") for t in TARGETS]]:
        # Evaluation splits are stored length-sorted; the probe takes record positions 0..4, not the longest pairs.
        assert cb.probe_info[split] == {"from": kind, "pairs": 5}
        ds = dm.datasets[kind]
        want = sorted(i for i in range(len(ds)) if ds[i]["index"] < 5)
        assert sorted(drift_module._first_pairs(ds, 5)) == want
    assert [h["step"] for h in cb.history] == [1]  # no validation run: the end of training is measured


@pytest.mark.parametrize("reference_first", [False, True])
def test_reuses_the_anchor_reference(word_tokenizer_dir, shared_cache, tmp_path, monkeypatch, reference_first):
    copies = []
    original = drift_module.FrozenReference
    monkeypatch.setattr(drift_module, "FrozenReference", lambda *a, **k: copies.append(1) or original(*a, **k))

    class Spy(Callback):
        def on_train_end(self, trainer, pl_module):
            self.same = cb.reference is ref_cb.reference and ref_cb.reference is not None
            self.owns = cb.owns_reference

    cb, ref_cb, spy = DriftDiagnosticsCallback(probe_pairs=4), ReferenceModelCallback(), Spy()
    order = [ref_cb, cb, spy] if reference_first else [cb, ref_cb, spy]  # the CLI appends ref_cb last
    _fit(word_tokenizer_dir, shared_cache, str(tmp_path), order, max_steps=2, anchor_coef=1e-3)
    assert spy.same and spy.owns is False and copies == []  # the very object, no second copy
    _assert_no_drift(cb.history[0]["drift"])
    assert cb.final_drift[SOURCE]["mse"]["layer2"] > 0


def test_resumed_run_compares_to_the_initial_weights(word_tokenizer_dir, shared_cache, tmp_path):
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, save_top_k=0)
    first = DriftDiagnosticsCallback(probe_pairs=4)
    pl.seed_everything(0)
    trainer = quiet_trainer(str(tmp_path / "a"), max_steps=3, limit_val_batches=0, enable_checkpointing=True,
                            callbacks=[first, ckpt])
    trainer.fit(tiny_model(word_tokenizer_dir), tiny_data(word_tokenizer_dir, shared_cache))
    resumed = DriftDiagnosticsCallback(probe_pairs=4)
    _fit(word_tokenizer_dir, shared_cache, str(tmp_path / "b"), [resumed], max_steps=4,
         ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    at_resume = [h for h in resumed.history if h["step"] == 3][-1]["drift"]  # measured at the resumed start
    assert at_resume[SOURCE]["mse"]["layer2"] > 0  # a copy of the resumed weights would read 0 here
    _assert_close(at_resume, first.final_drift)


def _assert_close(a, b):
    assert flat_drift(a) == pytest.approx(flat_drift(b), rel=1e-5, abs=1e-9)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="probe_pairs"):
        DriftDiagnosticsCallback(probe_pairs=1)
    with pytest.raises(ValueError, match="layers"):
        DriftDiagnosticsCallback(layers=[1.5])
    with pytest.raises(ValueError, match="every_n_val"):
        DriftDiagnosticsCallback(every_n_val=0)
