"""The VADER ICWSM corpus (docs/vader_icwsm.md) on a tiny fixture in the real files' format
(tests/fixtures/vader_icwsm/, written by tests/fixtures/make_vader_fixture.py): the reader, the pair rules on
hand-checked pairs, the splits by document, the adapter's records, the labelling functions' soft labels on
hand-computed values, the checksum refusals, and a labelling-function teacher through the W2S protocol. No network;
the real corpus is read by tests/test_vader_icwsm_slow.py."""
from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import tarfile
from collections import Counter

import pytest
import yaml

from datamodules.preference import vader_corpus
from datamodules.preference.labeller_labels import compute_labeller_labels, sigmoid
from datamodules.preference.labelling_functions import VaderLexicon, build_labeller, parse_spec
from datamodules.preference.sources import DataError, build_source
from datamodules.preference.sources.vader_icwsm import DEFAULT_PROMPT
from datamodules.preference.vader_corpus import CorpusError, install, read_domain
from datamodules.preference.vader_pairs import make_pairs, split_items
from datamodules.preference.weak_labels import checkpoint_key, swap_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "vader_icwsm")
HALVES = {"train": 0.5, "validation": 0.25, "test": 0.25}


def _ids(pairs):
    return [(c.id, r.id) for c, r in pairs]


# ---- the reader -------------------------------------------------------------------------------------------------
def test_reader_parses_the_real_format():
    tweets = read_domain("tweets", FIXTURE)
    assert [it.id for it in tweets] == [str(i) for i in range(1, 17)]
    first = tweets[0]
    assert (first.mean, first.text, first.document, first.ratings[:2], len(first.ratings)) == (
        2.5, "I love this sunny day :)", None, (3, 2), 20)
    amazon = read_domain("amazon", FIXTURE)  # its ratings file starts with a byte-order mark
    assert amazon[0].id == "1_1" and amazon[0].document == "1" and amazon[-1].document == "4"
    assert {d: len(read_domain(d, FIXTURE)) for d in vader_corpus.DOMAINS} == {
        "tweets": 16, "movies": 8, "amazon": 12, "nyt": 12}


def test_reader_refuses_a_malformed_line_naming_file_and_line(tmp_path):
    for name in os.listdir(FIXTURE):
        data = open(os.path.join(FIXTURE, name), "rb").read()
        if name == "tweets_GroundTruth.txt":
            data = data.replace(b"3\t0.5\tLunch", b"3\tfive\tLunch")
        (tmp_path / name).write_bytes(data)
    with pytest.raises(CorpusError, match=r"tweets_GroundTruth.txt:3: expected `ID <tab> mean rating"):
        read_domain("tweets", str(tmp_path))


# ---- pair rules -------------------------------------------------------------------------------------------------
def test_sorted_pairing_on_hand_checked_pairs():
    tweets = read_domain("tweets", FIXTURE)
    # sorted by mean: 4 14 8 12 2 10 16 6 | 3 13 9 5 11 1 15 7; item k with item k + 8, the higher mean chosen
    assert _ids(make_pairs(tweets, "sorted", 1.0)) == [
        ("3", "4"), ("13", "14"), ("9", "8"), ("5", "12"), ("11", "2"), ("1", "10"), ("15", "16"), ("7", "6")]
    dropped = Counter()
    # gaps 3.5 3.7 3.3 3.1 3.0 2.9 3.1 3.2: at 3.15 four stay
    assert _ids(make_pairs(tweets, "sorted", 3.15, dropped=dropped)) == [("3", "4"), ("13", "14"), ("9", "8"),
                                                                         ("7", "6")]
    assert dropped == {"small_gap": 4}


def test_within_document_pairing_on_hand_checked_pairs():
    amazon = read_domain("amazon", FIXTURE)
    dropped = Counter()
    pairs = _ids(make_pairs(amazon, "within_document", 1.0, dropped=dropped))
    # every two sentences of a review; 2_1 / 2_3 (gap 0.8) is the one below 1.0
    assert pairs == [("1_1", "1_2"), ("1_1", "1_3"), ("1_2", "1_3"), ("2_1", "2_2"), ("2_3", "2_2"),
                     ("3_1", "3_2"), ("3_1", "3_3"), ("3_2", "3_3"), ("4_2", "4_1"), ("4_3", "4_1"), ("4_2", "4_3")]
    assert dropped == {"small_gap": 1}
    assert len(make_pairs(amazon, "within_document", 2.5)) == 6  # gaps 2.8 5.0 3.1 6.1 4.1 2.6


def test_random_pairing_is_disjoint_seeded_and_respects_min_delta():
    tweets = read_domain("tweets", FIXTURE)
    pairs = make_pairs(tweets, "random", 0.0, seed=3)
    used = [it.id for pair in pairs for it in pair]
    assert len(pairs) == 8 and len(set(used)) == 16  # disjoint: each text once
    assert all(c.mean > r.mean for c, r in pairs)
    assert _ids(pairs) == _ids(make_pairs(tweets, "random", 0.0, seed=3))
    assert _ids(pairs) != _ids(make_pairs(tweets, "random", 0.0, seed=4))
    assert all(c.mean - r.mean >= 1.5 for c, r in make_pairs(tweets, "random", 1.5, seed=3))


def test_bad_pair_options_are_refused():
    tweets = read_domain("tweets", FIXTURE)
    with pytest.raises(ValueError, match="only the amazon and nyt domains"):
        make_pairs(tweets, "within_document")
    with pytest.raises(ValueError, match="pairs 'nearest'"):
        make_pairs(tweets, "nearest")
    with pytest.raises(ValueError, match=r"min_delta must be a number in \[0, 8\]"):
        make_pairs(tweets, "sorted", -1)


# ---- splits -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("domain", ["amazon", "nyt"])
def test_split_by_document_keeps_every_document_in_one_split(domain):
    items = read_domain(domain, FIXTURE)
    splits = split_items(items, HALVES, seed=0)
    documents = {name: {it.document for it in part} for name, part in splits.items()}
    assert [len(documents[s]) for s in ("train", "validation", "test")] == [2, 1, 1]  # of 4 documents
    assert not (documents["train"] & documents["validation"] or documents["train"] & documents["test"]
                or documents["validation"] & documents["test"])
    assert sorted(it.id for part in splits.values() for it in part) == sorted(it.id for it in items)
    assignments = {seed: {n: sorted(d) for n, d in
                          ((n, {it.document for it in p}) for n, p in split_items(items, HALVES, seed).items())}
                   for seed in range(4)}
    assert assignments[0] == {n: sorted(d) for n, d in documents.items()}  # seeded: the same again
    assert len({json.dumps(a, sort_keys=True) for a in assignments.values()}) > 1  # another seed, another split


def test_split_by_text_without_documents():
    splits = split_items(read_domain("tweets", FIXTURE), HALVES, seed=0)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [8, 4, 4]
    with pytest.raises(ValueError, match="split_fractions must give train, validation and test"):
        split_items(read_domain("tweets", FIXTURE), {"train": 0.9, "test": 0.1}, 0)


# ---- the adapter ------------------------------------------------------------------------------------------------
def test_adapter_records_are_the_pairs_of_each_split():
    src = build_source("vader_amazon", corpus_dir=FIXTURE, pairs="within_document", min_delta=1.0,
                       split_fractions=HALVES, split_seed=0)
    items = split_items(read_domain("amazon", FIXTURE), HALVES, 0)
    for split in ("train", "validation", "test"):
        part = src.load(split)
        expected = make_pairs(items[split], "within_document", 1.0)
        assert [(r["chosen"], r["rejected"]) for r in part.records] == [(c.text, r.text) for c, r in expected]
        for record, (c, r) in zip(part.records, expected):
            assert record["id"] == f"vader_amazon/{split}/{'~'.join(sorted((c.id, r.id)))}"
            assert record["prompt"] == [{"role": "user", "content": DEFAULT_PROMPT}]
            assert record["source"] == "vader_amazon" and record["split"] == split
            assert src.pair_items(record) == (c, r)  # the labellers find each text's ratings from the record
    assert DEFAULT_PROMPT == "Which of these is more positive?"
    custom = build_source("vader_tweets", corpus_dir=FIXTURE, split_fractions=HALVES, prompt="Rate the mood.")
    assert custom.load("test").records[0]["prompt"] == [{"role": "user", "content": "Rate the mood."}]


def test_adapter_refuses_bad_options():
    with pytest.raises(DataError, match="vader_tweets reads the VADER ICWSM corpus, not a local_dir"):
        build_source("vader_tweets", "/data/x")
    with pytest.raises(ValueError, match="prompt must be a non-empty string"):
        build_source("vader_tweets", corpus_dir=FIXTURE, prompt="  ")
    with pytest.raises(ValueError, match="only the amazon and nyt domains"):
        build_source("vader_movies", corpus_dir=FIXTURE, pairs="within_document")
    with pytest.raises(DataError, match="split 'test' has no pair"):
        build_source("vader_movies", corpus_dir=FIXTURE, split_fractions=HALVES, min_delta=8).load("test")


# ---- labelling functions ----------------------------------------------------------------------------------------
def _record(source, split, key, chosen, rejected):
    return {"id": f"{source}/{split}/{key}", "source": source, "split": split,
            "prompt": [{"role": "user", "content": DEFAULT_PROMPT}], "chosen": chosen, "rejected": rejected}


def test_one_rater_soft_labels_on_hand_computed_values(tmp_path):
    src = build_source("vader_tweets", corpus_dir=FIXTURE, split_fractions=HALVES)
    records = [_record("vader_tweets", "train", "3~4", "Lunch was fine", "This is the worst day ever"),
               _record("vader_tweets", "train", "6~7", "Best birthday ever, so happy!", "The bus arrives at noon"),
               _record("vader_tweets", "train", "10~6", "The bus arrives at noon", "Meh, another Monday")]
    tests = {"vader_tweets": records[:2]}
    out = str(tmp_path / "labels.json")
    payload = compute_labeller_labels("labeller:one_rater", records, tests, 0, out, records[2:], lambda n: src)
    # first rater: item 3 → 1, item 4 → -4 (Δ 5); item 7 → 4, item 6 → 0 (Δ 4); items 6 and 10 → 0 (a tie)
    for record, delta in zip(records, (5.0, 4.0, 0.0)):
        q, swapped = payload["labels"][record["id"]]
        assert swapped == swap_order(record["id"], 0)
        assert q == pytest.approx(sigmoid(-delta if swapped else delta), abs=1e-12)
    assert payload["teacher_margins"]["vader_tweets"] == {records[0]["id"]: 5.0, records[1]["id"]: 4.0}
    assert payload["validation_margins"] == {records[2]["id"]: 0.0}  # a tie: counted wrong by every accuracy
    assert payload["meta"]["teacher_checkpoint"] == "labeller:one_rater"
    three = compute_labeller_labels("labeller:one_rater:rater=1,temperature=2", records[:2], tests, 0,
                                    str(tmp_path / "l3.json"), None, lambda n: src)
    # raters 1..19 give round(mean): items 3 → 0 (0.5 rounds to even), 4 → -3, 7 → 3, 6 → 0; T = 2
    assert three["teacher_margins"]["vader_tweets"] == {records[0]["id"]: 1.5, records[1]["id"]: 1.5}


def test_vader_lexicon_soft_labels_on_hand_computed_values(tmp_path):
    lexicon = VaderLexicon()
    # compound = x / sqrt(x^2 + 15) of the lexicon valence x, rounded to 4 places: good 1.9, bad -2.5
    assert lexicon.compound("good") == round(1.9 / math.sqrt(1.9 ** 2 + 15), 4) == 0.4404
    assert lexicon.compound("bad") == round(-2.5 / math.sqrt(2.5 ** 2 + 15), 4) == -0.5423
    record = _record("vader_tweets", "train", "a~b", "good", "bad")
    payload = compute_labeller_labels("labeller:vader_lexicon", [record], {"t": [record]}, 0,
                                      str(tmp_path / "v.json"), None, lambda n: None)
    margin = (0.4404 + 0.5423) / 0.25
    q, swapped = payload["labels"][record["id"]]
    assert q == pytest.approx(sigmoid(-margin if swapped else margin), abs=1e-12)
    assert payload["teacher_margins"]["t"][record["id"]] == pytest.approx(margin, abs=1e-12)
    assert sigmoid(margin) == pytest.approx(0.98075, abs=1e-5)  # 1 / (1 + e^-3.9308)


def test_labeller_specs_are_checked_and_keyed():
    assert parse_spec("labeller:one_rater:rater=3,temperature=0.5") == ("one_rater", {"rater": "3",
                                                                                       "temperature": "0.5"})
    assert build_labeller("labeller:one_rater:rater=3,temperature=0.5").temperature == 0.5
    assert build_labeller("labeller:vader_lexicon").temperature == 0.25
    with pytest.raises(ValueError, match=r"--data.teacher_checkpoint 'labeller:nope': unknown labelling function"):
        build_labeller("labeller:nope")
    with pytest.raises(ValueError, match=r"'labeller:vader_lexicon:rater=2'.*unexpected keyword"):
        build_labeller("labeller:vader_lexicon:rater=2")
    with pytest.raises(ValueError, match="temperature must be > 0"):
        build_labeller("labeller:one_rater:temperature=0")
    key = checkpoint_key("labeller:vader_lexicon")
    assert key.startswith("labeller:vader_lexicon@vader_lexicon:1:vaderSentiment==")
    assert checkpoint_key("labeller:one_rater") != checkpoint_key("labeller:one_rater:rater=1")


def test_one_rater_refuses_a_source_without_ratings(tmp_path):
    record = _record("synth_helpful_cooking", "train", "0", "a", "b")
    with pytest.raises(ValueError, match="only the VADER ICWSM sources"):
        compute_labeller_labels("labeller:one_rater", [record], {}, 0, str(tmp_path / "x.json"), None,
                                lambda n: build_source(n))


# ---- install and checksums --------------------------------------------------------------------------------------
def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_install_refuses_an_altered_sdist_and_writes_nothing(tmp_path):
    fake = tmp_path / vader_corpus.SDIST
    fake.write_bytes(_tar_gz({vader_corpus.INNER: gzip.compress(b"not the corpus")}))
    target = tmp_path / "corpus"
    with pytest.raises(CorpusError, match=r"SHA-256 .* is not the pinned 5d7c06e027fc8b99… of vaderSentiment-3.3.2"
                                          r".*pip download --no-deps --no-binary :all: vaderSentiment==3.3.2"):
        install(str(fake), str(target))
    assert not target.exists() and os.listdir(tmp_path) == [vader_corpus.SDIST]
    with pytest.raises(CorpusError, match="no such file"):
        install(str(tmp_path / "absent.tar.gz"), str(target))


def test_installed_corpus_missing_or_altered_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SHIFTGEN_CACHE", str(tmp_path))
    with pytest.raises(CorpusError, match=r"^the VADER ICWSM corpus is not installed .* run `make vader`"):
        read_domain("tweets")
    with pytest.raises(DataError, match=r"^vader_tweets: the VADER ICWSM corpus is not installed"):
        build_source("vader_tweets").load("train")
    folder = tmp_path / vader_corpus.CORPUS_FOLDER
    folder.mkdir()
    for name in os.listdir(FIXTURE):  # the fixture's bytes under the real names: not the pinned files
        (folder / name).write_bytes(open(os.path.join(FIXTURE, name), "rb").read())
    with pytest.raises(CorpusError) as err:
        read_domain("tweets")
    assert re.fullmatch(r".*tweets_GroundTruth.txt is altered \(its SHA-256 is not the pinned one\): delete .* and "
                        r"run `make vader` .*", str(err.value)) and "\n" not in str(err.value)


# ---- the labelling-function teacher in the W2S protocol ---------------------------------------------------------
@pytest.fixture(scope="module")
def vader_tokenizer(tmp_path_factory) -> str:
    from datamodules.tokenizers import build_wordlevel_tokenizer

    words = set(re.findall(r"[A-Za-z0-9']+|[^\sA-Za-z0-9']", DEFAULT_PROMPT + " user assistant"))
    for domain in vader_corpus.DOMAINS:
        for it in read_domain(domain, FIXTURE):
            words.update(re.findall(r"[A-Za-z0-9']+|[^\sA-Za-z0-9']", it.text))
    out = str(tmp_path_factory.mktemp("vader_tokenizer"))
    build_wordlevel_tokenizer(words).save_pretrained(out)
    return out


def test_protocol_with_a_labelling_function_teacher(tmp_path, vader_tokenizer, cache_dir):
    from protocols.w2s.protocol import main as run_protocol, parse

    options = {"corpus_dir": FIXTURE, "pairs": "sorted", "min_delta": 0.5, "split_fractions": HALVES}
    sources = ["vader_tweets", "vader_movies", "vader_amazon"]
    common = [f"--data.source_options={json.dumps({s: options for s in sources})}", f"--data.cache_dir={cache_dir}",
              "--data.ood_targets=[\"vader_movies\", \"vader_amazon\"]", "--data.source=vader_tweets",
              "--data.max_length=48", "--data.teacher_fraction=0.5"]
    cfg = {"out_dir": str(tmp_path / "run"), "trainer_configs": [os.path.join(ROOT, "configs/trainer/cpu.yaml")],
           "data_configs": [os.path.join(ROOT, "configs/data/vader_tweets.yaml")],
           "teacher_labeller": "labeller:one_rater", "teacher_args": [f"--model.tokenizer={vader_tokenizer}"],
           "student_configs": [os.path.join(ROOT, "configs/model/tiny_teacher.yaml")],
           "student_args": [f"--model.tokenizer={vader_tokenizer}", "--trainer.max_epochs=1", *common],
           "seeds": [0], "ceiling": False, "drift": False, "methods": [{"name": "naive", "objective": "naive"}]}
    path = tmp_path / "protocol.yaml"
    path.write_text(yaml.safe_dump(cfg))
    results = run_protocol(["--config", str(path)])
    rows = results["rows"]

    # the teacher row, by hand: the first rater's scores on each split's test pairs (a tie counts wrong)
    def rater_acc(name):
        src = build_source(name, **options)
        pairs = [src.pair_items(r) for r in src.load("test").records]
        return 100.0 * sum(c.ratings[0] > r.ratings[0] for c, r in pairs) / len(pairs)

    # test pairs (chosen, rejected) and first raters: tweets (1, 16) 3 vs 3, a tie, and (7, 13) 4 vs 0; movies
    # (8, 7) 1 vs -4; amazon (4_3, 4_1) 0 vs 2, wrong
    assert {s: rater_acc(s) for s in sources} == {"vader_tweets": 50.0, "vader_movies": 100.0, "vader_amazon": 0.0}
    for split in sources:
        assert rows["teacher"][f"acc/{split}"]["mean"] == pytest.approx(rater_acc(split), abs=1e-9), split
    stage = json.load(open(os.path.join(cfg["out_dir"], "seed0", "teacher", "result.json")))
    assert stage["checkpoint"] == "labeller:one_rater" and stage["fit_seconds"] == 0.0
    student = json.load(open(os.path.join(cfg["out_dir"], "seed0", "naive", "result.json")))
    assert "--data.teacher_checkpoint=labeller:one_rater" in student["args"]
    for split in sources:  # the student's teacher accuracies are on the same pairs as the teacher row
        assert student["test"]["transfer"]["acc_teacher"][split] == pytest.approx(rater_acc(split), abs=1e-9)
    with pytest.raises(ValueError, match="--teacher_labeller is the teacher.*drop --teacher_configs"):
        parse(["--config", str(path), "--teacher_configs",
               json.dumps([os.path.join(ROOT, "configs/model/tiny_teacher.yaml")])])
    with pytest.raises(ValueError, match="--teacher_labeller 'labeller:nope': unknown labelling function"):
        parse(["--config", str(path), "--teacher_labeller", "labeller:nope"])
    with pytest.raises(ValueError, match="give the students' tokenizer in teacher_args"):
        parse(["--config", str(path), "--teacher_args", "[]"])
