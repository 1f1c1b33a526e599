"""Your own preference files as `local:<path>`: TRL's standard, conversational and implicit-prompt layouts from
jsonl / JSON-array / parquet, exact records and drop counts (fixtures: tests/fixtures/make_local_fixtures.py),
and the name working as --data.source and in --data.ood_targets."""
import json
from pathlib import Path

import pytest

from datamodules.preference.records import content_key
from datamodules.preference.sources import DataError, build_source, is_known_source
from datamodules.preference.sources.local_files import split_shared_prefix
from tests.helpers import SOURCE, synth_options, tiny_data

LOCAL = Path(__file__).parent / "fixtures" / "local"
SOURCE_ONLY = {SOURCE: synth_options()[SOURCE]}  # the synthetic source's options, without the other domains'


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def record(name, split, prompt, chosen, rejected, key=None):
    key = content_key(prompt, chosen, rejected) if key is None else key
    return {"id": f"{name}/{split}/{key}", "source": name, "split": split, "prompt": prompt, "chosen": chosen,
            "rejected": rejected}


def load(path, split="test"):
    name = f"local:{path}"
    return name, build_source(name).load(split)


@pytest.mark.parametrize("file, n_records, dropped", [
    ("standard.jsonl", 2,
     {"malformed": 1, "tie": 1, "empty_prompt": 1, "empty": 1, "identical": 1, "duplicate": 1}),
    ("conversational.parquet", 2, {"malformed": 2, "identical": 1}),
    ("implicit.json", 3, {"prompt_mismatch": 1, "malformed": 1, "empty_prompt": 1}),
])
def test_drop_counts(file, n_records, dropped):
    name, out = load(LOCAL / file)
    assert dict(out.dropped) == dropped
    assert len(out.records) == n_records
    assert out.origin == str(LOCAL / file)
    assert all(r["source"] == name and r["split"] == "test" for r in out.records)


def test_standard_records():
    name, out = load(LOCAL / "standard.jsonl")
    assert out.records == [
        record(name, "test", [user("What is the capital of Italy?")], "Rome.", "Milan."),
        record(name, "test", [user("Name a prime number.")], "7", "8"),  # stripped; its duplicate dropped
    ]


def test_conversational_records_from_parquet():
    name, out = load(LOCAL / "conversational.parquet")
    assert out.records == [
        record(name, "test", [{"role": "system", "content": "Answer briefly."}, user("How many legs does a spider have?")],
               "Eight.", "Six."),
        record(name, "test", [user("Recommend a book."), assistant("Fiction or not?"), user("Fiction.")],
               "Try 'The Hobbit'.", "Read a dictionary."),
    ]


def test_implicit_prompt_records_from_a_json_array():
    name, out = load(LOCAL / "implicit.json")
    assert out.records == [
        record(name, "test", [user("The sky is")], "blue.", "green."),
        record(name, "test", [user("My")], "cat is cute.", "car is fast."),
        record(name, "test", [user("What is 2 + 2?")], "4.", "5."),
    ]


@pytest.mark.parametrize("chosen, rejected, expected", [
    ("The sky is blue.", "The sky is green.", ("The sky is", " blue.", " green.")),
    ("My cat", "My car", ("My", " cat", " car")),  # TRL would cut inside the word: "My ca" + "t" / "r"
    ("abc def", "abc def ghi", ("abc", " def", " def ghi")),  # one text a prefix of the other
    ("Yes", "No", ("", "Yes", "No")),
    ("line one\nA", "line one\nB", ("line one", "\nA", "\nB")),
])
def test_split_shared_prefix(chosen, rejected, expected):
    assert split_shared_prefix(chosen, rejected) == expected


def test_folder_as_source_and_subset_ids():
    name, out = load(LOCAL / "folder")
    source = build_source(name)
    assert source.available_splits() == ["train", "test"]
    assert len(source.load("train").records) == 12
    assert dict(out.dropped) == {"malformed": 1}  # a row whose subset is null, in a file with a subset column
    assert [r["id"] for r in out.records] == [f"{name}/test/math/q-1", f"{name}/test/math/q-2",
                                              f"{name}/test/trivia%2Feasy/q%2F3"]  # quoted: one "/" inside the key
    assert [source.subset_of(r["id"]) for r in out.records] == ["math", "math", "trivia/easy"]


def test_ids_use_the_id_column_and_content_hash(tmp_path):
    path = tmp_path / "prefs.jsonl"
    rows = [{"id": 7, "prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "c", "rejected": "d"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    name, out = load(path)
    assert [r["id"] for r in out.records] == [f"{name}/test/7", f"{name}/test/{content_key([user('q')], 'c', 'd')}"]
    assert build_source(name).subset_of(out.records[0]["id"]) is None


# ---- errors -----------------------------------------------------------------------------------------------------
def test_names():
    assert is_known_source("local:/anything.jsonl") and is_known_source("rewardbench")
    assert not is_known_source("local:") and not is_known_source("locale:/x.jsonl")
    with pytest.raises(DataError, match=r"unknown preference source 'lokal:/x'.*or local:<path>"):
        build_source("lokal:/x")


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match=r"local:.*nope.jsonl: '.*nope.jsonl' is neither a file nor a directory"):
        build_source(f"local:{tmp_path}/nope.jsonl")


def test_one_file_is_a_test_split_only():
    with pytest.raises(DataError, match=r"is one file, which serves as the test split only.*local:<directory>"):
        build_source(f"local:{LOCAL / 'standard.jsonl'}").load("train")


def test_unpaired_format_is_refused(tmp_path):
    path = tmp_path / "kto.jsonl"
    path.write_text(json.dumps({"prompt": "p", "completion": "c", "label": True}) + "\n")
    with pytest.raises(DataError, match="TRL's unpaired preference format"):
        load(path)


def test_missing_column_lists_columns_found(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "a", "other": "b"}) + "\n")
    with pytest.raises(DataError, match=r"missing column\(s\) \['rejected'\]; columns found: \['chosen', 'other', 'prompt'\]"):
        load(path)


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n{oops\n")
    with pytest.raises(DataError, match=rf"{path}:2: malformed JSON line"):
        load(path)


def test_empty_after_filtering(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "a"}) + "\n")
    with pytest.raises(DataError, match=r"empty after filtering \(1 rows, dropped: \{'identical': 1\}\)"):
        load(path)


def test_local_dirs_do_not_apply(word_tokenizer_dir, cache_dir):
    name = f"local:{LOCAL / 'standard.jsonl'}"
    dm = tiny_data(word_tokenizer_dir, cache_dir, ood_targets=[name], local_dirs={name: "/data"},
                   source_options=SOURCE_ONLY)
    with pytest.raises(DataError, match="takes its path from its name, not from --data.local_dirs"):
        dm.setup("test")


# ---- in the data module ---------------------------------------------------------------------------------------
def test_files_as_ood_targets_and_folder_as_source(word_tokenizer_dir, cache_dir):
    targets = [f"local:{LOCAL / 'standard.jsonl'}", f"local:{LOCAL / 'implicit.json'}"]
    dm = tiny_data(word_tokenizer_dir, cache_dir, ood_targets=targets, source_options=SOURCE_ONLY)
    dm.setup("test")
    assert dm.test_split_names[1:] == targets
    assert [len(dm.datasets[f"test/{t}"]) for t in targets] == [2, 3]
    assert dm.manifest["dropped"][f"{targets[0]}/test"]["duplicate"] == 1

    folder = f"local:{LOCAL / 'folder'}"
    dm = tiny_data(word_tokenizer_dir, cache_dir, source=folder, ood_targets=targets[:1], source_options={},
                   val_fraction=0.25)
    dm.setup("fit")
    sizes = dm.manifest["sizes"]  # 12 train pairs: 3 carved as validation, 9 halved
    assert (sizes["validation"], sizes["train_teacher"], sizes["train_student"]) == (3, 4, 5)
    assert sizes[f"test/{folder}"] == 3
