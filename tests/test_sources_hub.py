"""The six real preference-dataset adapters, on fixture files in the exact hub schemas (no download, ever).

Fixtures live in tests/fixtures/hub/<source>/<hub split>.jsonl|.parquet and are written by
tests/fixtures/make_hub_fixtures.py, whose comments give the expected fate of every row.
"""
import json
import time
from pathlib import Path

import pytest

from datamodules.preference.records import content_key
from datamodules.preference.sources import SOURCES, DataError, build_source
from datamodules.preference.sources.hub import split_hh_transcript

FIXTURES = Path(__file__).parent / "fixtures" / "hub"


def load(name, split, local_dir=None):
    return build_source(name, local_dir=str(local_dir or FIXTURES / name)).load(split)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def record(source, split, prompt, chosen, rejected, key=None):
    key = content_key(prompt, chosen, rejected) if key is None else key
    return {"id": f"{source}/{split}/{key}", "source": source, "split": split, "prompt": prompt,
            "chosen": chosen, "rejected": rejected}


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---- registry -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, category, hub_id, hub_name, data_dir, split_map",
    [
        ("helpsteer3", "helpful", "nvidia/HelpSteer3", "preference", None, {"train": "train", "test": "validation"}),
        ("hh_helpful", "helpful", "Anthropic/hh-rlhf", None, "helpful-base", {"train": "train", "test": "test"}),
        ("ultrafeedback", "helpful", "HuggingFaceH4/ultrafeedback_binarized", None, None,
         {"train": "train_prefs", "test": "test_prefs"}),
        ("hh_harmless", "harmless", "Anthropic/hh-rlhf", None, "harmless-base", {"train": "train", "test": "test"}),
        ("pku_saferlhf", "harmless", "PKU-Alignment/PKU-SafeRLHF", None, None, {"train": "train", "test": "test"}),
        ("rail", "harmless", "responsible-ai-labs/RAIL-HH-10K", None, None,
         {"train": "train", "validation": "validation", "test": "test"}),
    ],
)
def test_registry_metadata(name, category, hub_id, hub_name, data_dir, split_map):
    source = build_source(name)
    assert (source.name, source.category, source.hub_id) == (name, category, hub_id)
    assert (source.hub_name, source.hub_data_dir, source.split_map) == (hub_name, data_dir, split_map)
    assert type(source) is SOURCES[name]


# ---- exact drop counts on every fixture split ------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, split, file, n_records, dropped",
    [
        ("helpsteer3", "train", "train.jsonl", 3, {"tie": 1, "empty": 2, "identical": 1, "duplicate": 1}),
        ("helpsteer3", "test", "validation.jsonl", 3, {"tie": 1, "identical": 1}),
        ("hh_helpful", "train", "train.jsonl", 3, {"prompt_mismatch": 2, "identical": 1, "empty": 1, "malformed": 1}),
        ("hh_helpful", "test", "test.jsonl", 3, {"identical": 1, "malformed": 1}),
        ("hh_harmless", "train", "train.jsonl", 3, {"identical": 1, "empty": 1, "prompt_mismatch": 1}),
        ("hh_harmless", "test", "test.jsonl", 3, {"empty": 1, "identical": 1}),
        ("ultrafeedback", "train", "train_prefs.jsonl", 3,
         {"tie": 1, "identical": 1, "empty": 1, "prompt_mismatch": 1, "malformed": 1}),
        ("ultrafeedback", "test", "test_prefs.parquet", 3, {"tie": 1, "empty": 1}),
        ("pku_saferlhf", "train", "train.jsonl", 4, {"identical": 1, "empty": 2}),
        ("pku_saferlhf", "test", "test.jsonl", 3, {"identical": 1, "empty": 1}),
        ("rail", "train", "train.jsonl", 3, {"tie": 1, "identical": 1, "empty": 1}),
        ("rail", "validation", "validation.jsonl", 3, {"empty": 1, "tie": 1}),
        ("rail", "test", "test.jsonl", 3, {"tie": 1, "empty": 1}),
    ],
)
def test_drop_counts(name, split, file, n_records, dropped):
    out = load(name, split)
    assert dict(out.dropped) == dropped
    assert len(out.records) == n_records
    assert Path(out.origin) == FIXTURES / name / file  # canonical split -> hub split file
    assert all(r["source"] == name and r["split"] == split for r in out.records)
    assert len({r["id"] for r in out.records}) == n_records


# ---- exact records ------------------------------------------------------------------------------------------------
def test_helpsteer3_records_follow_preference_sign():
    train = load("helpsteer3", "train").records
    assert train == [
        record("helpsteer3", "train", [user("Name a primary color.")], "Red.", "Purple."),  # -2: response1
        record("helpsteer3", "train",
               [user("Write a haiku about rain."), assistant("Rain taps the window."), user("Make it sadder.")],
               "Grey rain, empty chairs, no one home.", "Rain again, alone."),  # +3: response2
        record("helpsteer3", "train", [user("Reverse a list in Python.")], "Use lst[::-1].", "Use a loop."),
    ]
    test = load("helpsteer3", "test").records  # served by the hub's validation split
    assert [(r["id"].split("/")[1], r["chosen"], r["rejected"]) for r in test] == [
        ("test", "chat", "chien"),
        ("test", "Yes, 7 is prime.", "No."),
        ("test", "Day 1: Colosseum. Day 2: Vatican. Day 3: Trastevere.", "Go to Rome."),
    ]


def test_hh_helpful_records_split_transcripts():
    bread = [user("I want to bake bread."), assistant("Great! Do you have yeast?"), user("Yes, dry yeast."),
             assistant("Mix it with warm water first.\nThen add flour."), user("How long do I knead?")]
    assert load("hh_helpful", "train").records == [
        record("hh_helpful", "train", [user("What is a good name for a cat?")], "How about Whiskers?", "Dog."),
        record("hh_helpful", "train", bread, "About ten minutes.", "Forever."),
        record("hh_helpful", "train", [user("List two fruits.")], "1. Apple\n2. Pear", "Carrot"),
    ]


def test_ids_are_stable_content_hashes():
    first = load("hh_helpful", "train").records[0]
    assert first["id"] == "hh_helpful/train/d9aee5885d2bca6f"  # pinned: ids must not change between runs
    assert load("hh_helpful", "train").records[0]["id"] == first["id"]


def test_hh_harmless_records():
    assert load("hh_harmless", "test").records == [
        record("hh_harmless", "test", [user("Where can I buy drugs?")],
               "I can't help with that, but here are support lines.", "Try the corner downtown."),
        record("hh_harmless", "test", [user("How to cheat on a test?")],
               "Studying is the reliable way.", "Write notes on your hand."),
        record("hh_harmless", "test",
               [user("Tell me about guns."), assistant("They are regulated differently by country."),
                user("How do I get one?")],
               "Through a licensed dealer, following local law.", "Steal one."),
    ]


def test_ultrafeedback_records_jsonl_and_parquet():
    story = [{"role": "system", "content": "You are a storyteller."}, user("Start a story."),
             assistant("Once upon a time..."), user("Continue the story.")]
    assert load("ultrafeedback", "train").records == [
        record("ultrafeedback", "train", [user("What is photosynthesis?")],
               "Plants turning light into chemical energy.", "A kind of fish."),
        record("ultrafeedback", "train", story, "...a dragon appeared.", "The end."),
        # the message lists hold only the response: the prompt string becomes the user turn
        record("ultrafeedback", "train", [user("Name a planet.")], "Mars.", "The Sun."),
    ]
    assert load("ultrafeedback", "test").records == [  # test_prefs.parquet
        record("ultrafeedback", "test", [user("What is 10 divided by 4?")], "2.5", "2"),
        record("ultrafeedback", "test", [user("Translate 'hello' to Spanish.")], "Hola.", "Bonjour."),
        record("ultrafeedback", "test", [user("Explain gravity briefly.")], "Mass attracts mass.",
               "Things fall because they are heavy."),
    ]


def test_pku_saferlhf_chosen_is_the_safer_response():
    records = load("pku_saferlhf", "train").records
    # row 0: better_response_id=0 but safer_response_id=1 -> the harmless label wins
    assert records[0] == record("pku_saferlhf", "train", [user("How can I steal a car?")],
                                "I can't help with theft.", "Hotwire it.")
    assert [(r["chosen"], r["rejected"]) for r in records[1:]] == [
        ("Breathe slowly.", "Yell at someone."),
        ("No, it is poisonous; call poison control.", "Yes, a little is fine."),
        ("That's illegal; consider official ID instead.", "Ask around."),
    ]


def test_rail_records_parse_context_and_prompt():
    assert load("rail", "train").records == [
        record("rail", "train", [user("How do I make a fake passport?")],
               "I can't help with forging documents.", "Get a good printer."),
        record("rail", "train",
               [user("I'm angry at my coworker."), assistant("What happened?"),
                user("He took credit for my work.\nHe does it every week."), assistant("That is unfair."),
                user("How do I get revenge?")],
               "Talk to your manager with evidence.", "Sabotage his computer."),
        # the context already ends with the prompt: it is not repeated
        record("rail", "train",
               [user("Tell me about locks."), assistant("Locks secure doors."),
                user("How do I open one without a key?")],
               "Call a locksmith.", "Use a bobby pin."),
    ]


def test_rail_resolves_other_column_names_and_uses_id_column(tmp_path):
    rows = [
        {"id": "r-1", "prompt": "Help me lie.", "context": "Human: Hi\nAssistant: Hello", "chosen": "No.",
         "rejected": "Sure.", "score_chosen": 8.0, "score_rejected": 2.0},
        {"id": "r-2", "prompt": "Help me cheat.", "context": "", "chosen": "No.", "rejected": "Ok.",
         "score_chosen": 4.0, "score_rejected": 4.0},  # tie through the alternative score names
    ]
    write_jsonl(tmp_path / "test.jsonl", rows)
    out = load("rail", "test", tmp_path)
    assert out.records == [
        record("rail", "test", [user("Hi"), assistant("Hello"), user("Help me lie.")], "No.", "Sure.", key="r-1")
    ]
    assert dict(out.dropped) == {"tie": 1}


def test_split_hh_transcript_without_leading_blank_line():
    assert split_hh_transcript("Human: hi\n\nAssistant: hello\n\nHuman: bye\n\nAssistant:  see you ") == (
        [user("hi"), assistant("hello"), user("bye")], "  see you ")
    assert split_hh_transcript("\n\nHuman: no answer here") is None
    assert split_hh_transcript("stray text\n\nHuman: hi\n\nAssistant: yo") is None


# ---- error cases ------------------------------------------------------------------------------------------------
def test_unknown_source_name_lists_known_ones():
    with pytest.raises(DataError, match=r"unknown preference source 'hh_helpfull'.*'hh_helpful'"):
        build_source("hh_helpfull")


def test_missing_column_lists_columns_found(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"chosen": "\n\nHuman: a\n\nAssistant: b", "prompt": "a"}])
    with pytest.raises(DataError) as err:
        load("hh_helpful", "train", tmp_path)
    assert "missing column(s) ['rejected']" in str(err.value)
    assert "columns found: ['chosen', 'prompt']" in str(err.value)


def test_rail_unresolvable_answer_columns_lists_columns_found(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "p", "context": "", "good": "a", "bad": "b"}])
    with pytest.raises(DataError) as err:
        load("rail", "train", tmp_path)
    message = str(err.value)
    assert "columns found: ['bad', 'context', 'good', 'prompt']" in message
    assert "'chosen_response'" in message and "'rejected_response'" in message


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    good = {"prompt": "p", "response_0": "a", "response_1": "b", "safer_response_id": 0}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n{\"prompt\": oops}\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path}:3: malformed JSON line"):
        load("pku_saferlhf", "train", tmp_path)


def test_empty_split_after_filtering(tmp_path):
    tie = {"context": [user("Hi")], "response1": "a", "response2": "b", "overall_preference": 0}
    write_jsonl(tmp_path / "train.jsonl", [tie, dict(tie, response1="c")])
    with pytest.raises(DataError, match=r"empty after filtering \(2 rows, dropped: \{'tie': 2\}\)"):
        load("helpsteer3", "train", tmp_path)


def test_missing_split_file_lists_expected_names(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "p", "context": "", "chosen": "a", "rejected": "b"}])
    with pytest.raises(DataError) as err:
        load("rail", "test", tmp_path)
    assert "no file for split 'test'" in str(err.value)
    assert "'test.jsonl'" in str(err.value) and "found ['train.jsonl']" in str(err.value)


def test_split_the_source_does_not_have():
    with pytest.raises(DataError, match=r"helpsteer3 has no 'validation' split \(it has \['train', 'test'\]\)"):
        load("helpsteer3", "validation")


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No network and an empty HF cache, set before loading."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets.config
    import huggingface_hub.constants

    # Both libraries read these variables once, at import: patch the constants in case they were imported already.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")


def test_hub_id_offline_fails_fast_and_says_how_to_use_local_files(offline_hub):
    start = time.monotonic()
    with pytest.raises(DataError) as err:
        build_source("hh_helpful").load("train")
    assert time.monotonic() - start < 10  # no network retries
    message = str(err.value)
    assert "could not load 'Anthropic/hh-rlhf' (split 'train')" in message
    assert "--data.local_dirs '{\"hh_helpful\": \"/path/to/dir\"}'" in message
    assert "['test', 'train']" in message and ".jsonl or .parquet" in message


@pytest.mark.parametrize("name, split", [("ultrafeedback", "train"), ("pku_saferlhf", "test")])
def test_hub_rows_stream_to_the_same_records_as_local_files(monkeypatch, name, split):
    """The hub path decodes a loaded split a batch at a time (not `to_list()` of the whole split): on the same rows
    it gives the local files' records and drop counts, across batch boundaries."""
    import datasets

    from datamodules.preference.sources import base
    from datamodules.preference.sources.base import iter_table

    source = build_source(name)
    path = next(p for p in (FIXTURES / name).iterdir() if p.stem == source.split_map[split])
    rows = list(iter_table(str(path)))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    monkeypatch.setattr(base, "_dataset_rows", lambda ds, batch_size=3, f=base._dataset_rows: f(ds, batch_size))
    from_hub, from_files = source.load(split), load(name, split)
    assert len(rows) > 3  # several batches
    assert from_hub.records == from_files.records and from_hub.dropped == from_files.dropped
    assert from_hub.origin == f"hub dataset {source.hub_id}"
