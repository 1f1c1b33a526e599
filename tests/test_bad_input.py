"""Bad input fails early with a message naming the flag, file, row or column, and leaves no half-written cache."""
import os

import pytest

from datamodules.preference.sources import DataError
from tests.helpers import tiny_data, tiny_model


def test_unknown_source_names_the_flag(word_tokenizer_dir, cache_dir):
    with pytest.raises(DataError, match=r"--data.source: unknown preference source 'hh_helpfull'"):
        tiny_data(word_tokenizer_dir, cache_dir, source="hh_helpfull", source_options={})
    with pytest.raises(DataError, match=r"--data.ood_targets: unknown preference source 'nope'"):
        tiny_data(word_tokenizer_dir, cache_dir, ood_targets=["nope"], source_options={})


@pytest.mark.parametrize("kwargs, message", [
    (dict(ood_targets=["synth_helpful_cooking"]), "OOD targets must differ"),
    (dict(truncation="middle"), "--data.truncation"),
    (dict(train_subset="both"), "--data.train_subset"),
    (dict(teacher_fraction=1.0), "--data.teacher_fraction"),
    (dict(max_pairs={"dev": 10}), "--data.max_pairs"),
    (dict(local_dirs={"hh_helpful": "/x"}), "--data.local_dirs names"),
    (dict(weak_labels="/tmp/labels.json"), "set --data.train_subset student"),
    (dict(train_subset="student", train_labels="silver"), "--data.train_labels"),
])
def test_contradictory_data_config(word_tokenizer_dir, cache_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_data(word_tokenizer_dir, cache_dir, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(anchor_coef=-1.0), "--model.anchor_coef"),
    (dict(anchor_layers=[0.0]), "--model.anchor_layers"),
    (dict(anchor_layers=[]), "--model.anchor_layers"),
    (dict(quantization="4bit"), "--model.quantization"),
    (dict(pooling="max"), "--model.pooling"),
    (dict(tokenizer=None), "--model.tokenizer is required"),
    (dict(backbone="minilm", tiny_config={"hidden_size": 8}), "--model.tiny_config only applies"),
    (dict(backbone="minilm", tokenizer="minilm", keep_layers=7), r"--model.keep_layers must be in \[0, 6\]"),
    (dict(keep_layers=1), "--model.keep_layers applies to pretrained backbones"),
    (dict(anchor_coef=1.0, anchor_layers=[0.5, 1.0], freeze_layers=1), r"hidden state\(s\) \[1\].*identically 0"),
])
def test_contradictory_model_config(word_tokenizer_dir, kwargs, message):
    with pytest.raises((ValueError, OSError), match=message):
        tiny_model(word_tokenizer_dir, **kwargs)


def test_tokenizer_without_pad_token(tmp_path):
    from datamodules.tokenizers import build_wordlevel_tokenizer, load_tokenizer

    tok = build_wordlevel_tokenizer(["a", "b"])
    tok.pad_token = None
    tok.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="has no pad token"):
        load_tokenizer(str(tmp_path))


def test_hub_id_without_network_says_how_to_use_local_files():
    from datamodules.tokenizers import load_tokenizer

    with pytest.raises(OSError, match="pass a local directory"):
        load_tokenizer("some-org/not-downloadable-here")


def test_missing_teacher_checkpoint(word_tokenizer_dir, cache_dir):
    with pytest.raises(ValueError, match="--data.teacher_checkpoint '/nope.ckpt' does not exist"):
        tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", teacher_checkpoint="/nope.ckpt")


def test_teacher_checkpoint_that_is_not_a_checkpoint(word_tokenizer_dir, cache_dir, tmp_path):
    bogus = tmp_path / "teacher.ckpt"
    bogus.write_text("epoch 1: loss 0.3\n")  # e.g. a log file given by mistake
    with pytest.raises(ValueError, match=r"--data.teacher_checkpoint .*teacher.ckpt' is not a torch checkpoint"):
        tiny_data(word_tokenizer_dir, cache_dir, train_subset="student", teacher_checkpoint=str(bogus))


def test_crash_while_tokenizing_leaves_no_cache(word_tokenizer_dir, cache_dir, monkeypatch):
    import datamodules.preference.datamodule as pd

    calls = {"n": 0}
    real = pd.PairTokenizer.__call__

    def crash_on_third_split(self, batch, counts=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated crash")
        return real(self, batch, counts)

    monkeypatch.setattr(pd.PairTokenizer, "__call__", crash_on_third_split)
    with pytest.raises(KeyboardInterrupt):
        tiny_data(word_tokenizer_dir, cache_dir).prepare_data()
    entries = os.listdir(os.path.join(cache_dir, "tokenized"))
    assert len(entries) == 2 and not any(".tmp" in e or ".raw" in e for e in entries)  # two complete splits, nothing partial
    monkeypatch.setattr(pd.PairTokenizer, "__call__", real)
    dm = tiny_data(word_tokenizer_dir, cache_dir)
    dm.setup("fit")  # the next run completes the cache, reusing the two finished splits
    cached = [k for k, v in dm.manifest["tokenization"].items() if v["cached"]]
    assert len(cached) == 2


def test_empty_split_after_caps_is_an_error(word_tokenizer_dir, cache_dir):
    from tests.helpers import synth_options

    dm = tiny_data(word_tokenizer_dir, cache_dir, source_options=synth_options(n_train=1))
    with pytest.raises(DataError, match="train_teacher"):
        dm.setup("fit")


def test_unreadable_parquet_names_the_file(tmp_path):
    from datamodules.preference.sources import build_source

    (tmp_path / "train_prefs.parquet").write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(DataError, match=r"train_prefs\.parquet: cannot read parquet"):
        build_source("ultrafeedback", local_dir=str(tmp_path)).load("train")
