"""Data preparation at size: the same cached data with map processes, and a warm cache that skips the records."""
import json
import os

import pytest

from tests.helpers import synth_options, tiny_data


def _columns(dm) -> dict:
    return {kind: ds.cols for kind, ds in dm.datasets.items()}


def test_num_proc_gives_the_same_tokenized_splits(word_tokenizer_dir, tmp_path):
    one = tiny_data(word_tokenizer_dir, str(tmp_path / "one"))
    one.setup("fit")
    two = tiny_data(word_tokenizer_dir, str(tmp_path / "two"), num_proc=2)
    two.setup("fit")
    assert not any(v["cached"] for v in two.manifest["tokenization"].values())  # tokenized here, in 2 processes
    assert _columns(two) == _columns(one)
    assert set(one.datasets) == {"train_teacher", "validation", "test/synth_helpful_cooking",
                                 "test/synth_helpful_science", "test/synth_helpful_travel"}


def test_raw_columns_in_chunks_give_the_same_tokenized_splits(word_tokenizer_dir, tmp_path, monkeypatch):
    """The raw columns go to disk a chunk of records at a time (bounded memory at 10^5 pairs); chunks of 7 records,
    with 2 map processes reading them by path, tokenize to the same columns in the same order as one chunk."""
    import functools

    import datamodules.preference.datamodule as pd

    whole = tiny_data(word_tokenizer_dir, str(tmp_path / "whole"))
    whole.setup("fit")
    monkeypatch.setattr(pd, "_raw_columns_on_disk", functools.partial(pd._raw_columns_on_disk, chunk=7))
    chunked = tiny_data(word_tokenizer_dir, str(tmp_path / "chunked"), num_proc=2)
    chunked.setup("fit")
    assert min(len(ds) for ds in chunked.datasets.values()) > 7  # every split spans several chunks
    assert _columns(chunked) == _columns(whole)
    leftovers = [e for e in os.listdir(tmp_path / "chunked" / "tokenized") if ".raw" in e or ".tmp" in e]
    assert leftovers == []  # the raw columns are removed once tokenized


def test_num_proc_is_validated(word_tokenizer_dir, cache_dir):
    with pytest.raises(ValueError, match="--data.num_proc"):
        tiny_data(word_tokenizer_dir, cache_dir, num_proc=0)


def test_warm_cache_loads_no_records_and_gives_the_same_data(word_tokenizer_dir, cache_dir, monkeypatch, tmp_path):
    import datamodules.preference.datamodule as pd

    first = tiny_data(word_tokenizer_dir, cache_dir, train_subset="all")
    first.prepare_data()
    first.setup("fit")

    def boom(self):
        raise AssertionError("records loaded although the cache was complete for these inputs")

    monkeypatch.setattr(pd.PreferenceDataModule, "load_records", boom)
    second = tiny_data(word_tokenizer_dir, cache_dir, train_subset="all")
    second.prepare_data()
    second.setup("fit")
    assert _columns(second) == _columns(first)
    assert all(v["cached"] for v in second.manifest["tokenization"].values())
    strip = lambda m: {k: v for k, v in m.items() if k != "tokenization"}  # noqa: E731
    assert strip(json.loads(json.dumps(second.manifest))) == strip(json.loads(json.dumps(first.manifest)))
    assert second._split_ids == first._split_ids and len(second._split_ids["train_student"]) == 120
    # other generator options are other records: not served from this index
    with pytest.raises(AssertionError, match="records loaded"):
        tiny_data(word_tokenizer_dir, cache_dir, train_subset="all",
                  source_options=synth_options(n_train=250)).setup("fit")
    with pytest.raises(AssertionError, match="records loaded"):
        tiny_data(word_tokenizer_dir, cache_dir, train_subset="all", seed=1).setup("fit")


def test_changed_local_file_invalidates_the_index(word_tokenizer_dir, cache_dir, monkeypatch, tmp_path):
    import datamodules.preference.datamodule as pd

    rows = [{"prompt": f"question {i}", "chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(30)]
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    name = f"local:{path}"
    kw = dict(ood_targets=[name], source_options={"synth_helpful_cooking": synth_options()["synth_helpful_cooking"]})
    tiny_data(word_tokenizer_dir, cache_dir, **kw).setup("fit")
    calls = {"n": 0}
    real = pd.PreferenceDataModule.load_records

    def counting(self):
        calls["n"] += 1
        return real(self)

    monkeypatch.setattr(pd.PreferenceDataModule, "load_records", counting)
    tiny_data(word_tokenizer_dir, cache_dir, **kw).setup("fit")
    assert calls["n"] == 0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))
    os.utime(path, ns=(1, 1))  # a new size and time: other rows
    dm = tiny_data(word_tokenizer_dir, cache_dir, **kw)
    dm.setup("fit")
    assert calls["n"] == 1 and len(dm.datasets[f"test/{name}"]) == 20
