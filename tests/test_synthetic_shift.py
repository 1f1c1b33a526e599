"""The synthetic preference-shift benchmark: determinism, split hygiene, artifact rates, options, schema, words."""
import re

import pytest

from datamodules.preference import synthetic_lexicon as lex
from datamodules.preference.records import CANONICAL_SPLITS, RECORD_KEYS
from datamodules.preference.sources import SOURCES, DataError
from datamodules.preference.sources.synthetic import SYNTHETIC_SOURCES
from datamodules.preference.synthetic_shift import (
    CATEGORIES,
    DEFAULT_ARTIFACT_RATES,
    benchmark_domains,
    generate_domain,
    has_artifact,
    prompt_split,
    source_name,
    split_words,
    synthetic_vocabulary,
    topic_words,
)

DOMAINS = [(c, d) for c, d, _ in benchmark_domains()]


def pair_key(row):
    return (row["prompt"], row["chosen"], row["rejected"])


def strip_artifacts(category, text):
    phrases = (lex.ENTHUSIASM_OPENERS + lex.ENTHUSIASM_CLOSERS if category == "helpful"
               else lex.VERBOSITY_OPENERS + lex.VERBOSITY_CLOSERS)
    for phrase in phrases:
        text = text.replace(phrase + " ", "").replace(" " + phrase, "")
    return text


def measured_rate(rows):
    return sum(r["artifact_on_chosen"] is True for r in rows) / len(rows)


# ---- determinism and splits ------------------------------------------------------------------------------
def test_same_seed_same_rows_and_prefix_stable():
    a = generate_domain("helpful", "science", "train", seed=3, n_train=300, difficulty="hard")
    b = generate_domain("helpful", "science", "train", seed=3, n_train=300, difficulty="hard")
    assert a == b
    head = generate_domain("helpful", "science", "train", seed=3, n_train=50, difficulty="hard")
    assert head == a[:50]  # the first k rows do not depend on the split size


def test_different_seeds_differ():
    a = generate_domain("harmless", "cyber", "train", seed=0, n_train=300)
    b = generate_domain("harmless", "cyber", "train", seed=1, n_train=300)
    shared = {pair_key(r) for r in a} & {pair_key(r) for r in b}
    assert len(shared) < 15, len(shared)  # a few coincidences are possible, not a shared sequence
    assert sum(x["prompt"] == y["prompt"] for x, y in zip(a, b)) < 15


@pytest.mark.parametrize("category,domain", DOMAINS)
def test_splits_are_disjoint_and_duplicate_free(category, domain):
    sizes = {"n_train": 600, "n_validation": 150, "n_test": 200}
    prompts, pairs = {}, {}
    for split in CANONICAL_SPLITS:
        rows = generate_domain(category, domain, split, seed=5, difficulty="hard", **sizes)
        assert len(rows) == sizes[f"n_{split}"]
        keys = [pair_key(r) for r in rows]
        assert len(set(keys)) == len(keys), f"duplicate pairs inside {split}"
        assert all(prompt_split(r["prompt"]) == split for r in rows)
        prompts[split], pairs[split] = {r["prompt"] for r in rows}, set(keys)
    for a, b in [("train", "validation"), ("train", "test"), ("validation", "test")]:
        assert not prompts[a] & prompts[b], f"{a} and {b} share prompts"
        assert not pairs[a] & pairs[b]
    # the split of a prompt is a property of its text: another seed cannot move a test prompt into train
    other_seed_train = generate_domain(category, domain, "train", seed=6, n_train=600, difficulty="hard")
    assert not {r["prompt"] for r in other_seed_train} & prompts["test"]


# ---- artifacts -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("category,domain", DOMAINS)
def test_artifact_rate_and_placement(category, domain):
    rows = generate_domain(category, domain, "train", n_train=2000)
    expected = DEFAULT_ARTIFACT_RATES[category][domain]
    on_chosen = [has_artifact(category, r["chosen"]) for r in rows]
    on_rejected = [has_artifact(category, r["rejected"]) for r in rows]
    if expected is None:
        assert not any(on_chosen) and not any(on_rejected)
        assert all(r["artifact_on_chosen"] is None for r in rows)
        return
    assert all(c != r for c, r in zip(on_chosen, on_rejected)), "artifact must sit on exactly one response"
    assert on_chosen == [r["artifact_on_chosen"] for r in rows]  # the text agrees with the hidden metadata
    assert measured_rate(rows) == pytest.approx(expected, abs=0.035)  # 2000 pairs: sd <= 0.011


def test_source_rates_are_high_and_targets_shifted():
    for category, domains in DEFAULT_ARTIFACT_RATES.items():
        source, *targets = CATEGORIES[category]
        assert domains[source] >= 0.8
        rates = [domains[t] for t in targets]
        assert None in rates and min(r for r in rates if r is not None) < 0.5  # absent and anti-correlated


def test_artifact_rate_override_moves_only_the_artifact():
    default = generate_domain("helpful", "cooking", "train", n_train=2000)
    lowered = generate_domain("helpful", "cooking", "train", n_train=2000, artifact_rate=0.7)
    assert measured_rate(lowered) == pytest.approx(0.7, abs=0.035)
    assert [r["prompt"] for r in lowered] == [r["prompt"] for r in default]
    assert all(strip_artifacts("helpful", x["chosen"]) == strip_artifacts("helpful", y["chosen"])
               for x, y in zip(default, lowered))
    # coupled draws: lowering the rate only removes artifacts from chosen responses, never adds one
    assert all(x["artifact_on_chosen"] or not y["artifact_on_chosen"] for x, y in zip(default, lowered))


def test_artifact_switches():
    switched_on = generate_domain("helpful", "tech", "train", n_train=2000, artifact_rate=0.3)
    assert measured_rate(switched_on) == pytest.approx(0.3, abs=0.035)
    off = generate_domain("harmless", "household", "train", n_train=500, artifacts=False)
    assert not any(has_artifact("harmless", r[k]) for r in off for k in ("chosen", "rejected"))
    always = generate_domain("harmless", "finance", "test", n_test=200, artifact_rate=1.0)
    assert all(has_artifact("harmless", r["chosen"]) and not has_artifact("harmless", r["rejected"]) for r in always)


def test_verbosity_artifact_lengthens_and_base_length_is_balanced():
    rows = generate_domain("harmless", "medical", "train", n_train=1000)  # the no-artifact target
    longer = sum(len(split_words(r["chosen"])) > len(split_words(r["rejected"])) for r in rows) / len(rows)
    ties = sum(len(split_words(r["chosen"])) == len(split_words(r["rejected"])) for r in rows) / len(rows)
    assert abs(longer + ties / 2 - 0.5) < 0.08  # without the artifact, length says little
    rows = generate_domain("harmless", "household", "train", n_train=1000)
    longer = sum(len(split_words(r["chosen"])) > len(split_words(r["rejected"])) for r in rows) / len(rows)
    assert longer > 0.8  # with it (rate 0.85) the longer response is mostly the chosen one


# ---- the rule and the hard variant ---------------------------------------------------------------------------
def test_easy_helpful_rule_is_topic_match():
    for domain in CATEGORIES["helpful"]:
        for r in generate_domain("helpful", domain, "test", n_test=300):
            words_c, words_r = set(split_words(r["chosen"])), set(split_words(r["rejected"]))
            assert set(r["topic_words"]) <= words_c and not set(r["topic_words"]) & words_r
            assert r["case"] == "off_topic" and r["decidable"]


def test_easy_harmless_rule_refuses_exactly_the_dangerous_requests():
    refusal_starts = tuple(t.split("{")[0] for t in lex.HARMLESS_REFUSALS)
    for domain in CATEGORIES["harmless"]:
        rows = generate_domain("harmless", domain, "test", n_test=300, artifacts=False)
        assert 0.4 < sum(r["dangerous"] for r in rows) / len(rows) < 0.6
        for r in rows:
            assert r["chosen"].startswith(refusal_starts) == r["dangerous"]
            assert r["rejected"].startswith(refusal_starts) != r["dangerous"]


@pytest.mark.parametrize("category", sorted(CATEGORIES))
def test_hard_variant_mix_and_ceiling(category):
    rows = generate_domain(category, CATEGORIES[category][1], "train", n_train=2000, difficulty="hard")
    ambiguous = sum(not r["decidable"] for r in rows) / len(rows)
    assert ambiguous == pytest.approx(0.1, abs=0.02)
    assert 1 - ambiguous / 2 < 0.97  # the rule's ceiling is below 100%
    wrong_cases = {"helpful": {"wrong_question"}, "harmless": {"hedged_compliance", "unsafe_advice"}}[category]
    assert sum(r["case"] in wrong_cases for r in rows) / len(rows) == pytest.approx(0.4, abs=0.035)
    named = sum(set(r["topic_words"]) <= set(split_words(r["chosen"])) for r in rows) / len(rows)
    if category == "helpful":  # half of the responses name the topic by a paraphrase
        assert named == pytest.approx(0.5, abs=0.04)
    else:  # every response restates the request, in whichever form the prompt used
        assert named == 1.0


# ---- options -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options,named",
    [({"artifact_rte": 0.5}, "artifact_rte"), ({"difficulty": "medium"}, "difficulty"),
     ({"artifact_rate": 1.5}, "artifact_rate"), ({"n_test": 0}, "n_test"), ({"seed": "zero"}, "seed"),
     ({"artifacts": "no"}, "artifacts")],
)
def test_bad_options_raise_value_error_naming_them(options, named):
    with pytest.raises(ValueError, match=named):
        generate_domain("helpful", "cooking", "test", **options)
    with pytest.raises(ValueError, match=named):
        SOURCES["synth_helpful_cooking"](**options)


def test_unknown_domain_split_and_local_dir():
    with pytest.raises(ValueError, match="'baking'"):
        generate_domain("helpful", "baking", "test")
    with pytest.raises(ValueError, match="'dev'"):
        generate_domain("helpful", "cooking", "dev")
    with pytest.raises(DataError, match="local_dir"):
        SOURCES["synth_harmless_cyber"](local_dir="/tmp")


def test_too_many_pairs_for_the_space_is_a_clear_error(monkeypatch):
    tiny = {"leads": (), "topics": (("kale", "a curly green"), ("figs", "sweet purple fruit")),
            "questions": {"store": {"prompts": ("How should I store {t}?",), "advice": ("keep it cool", "keep it dry")}}}
    monkeypatch.setitem(lex.HELPFUL_DOMAINS, "cooking", tiny)
    monkeypatch.setattr(lex, "HELPFUL_RESPONSES", ("For {t}, {a1} and {a2}.",))  # 4 pairs per prompt
    assert len(generate_domain("helpful", "cooking", "train", n_train=5)) == 5
    with pytest.raises(ValueError, match="n_train"):
        generate_domain("helpful", "cooking", "train", n_train=100)


# ---- registered sources and records --------------------------------------------------------------------------
def test_sources_registered_with_categories():
    assert sorted(SYNTHETIC_SOURCES) == sorted(source_name(c, d) for c, d in DOMAINS)
    assert len(SYNTHETIC_SOURCES) == 8
    for category, domain in DOMAINS:
        cls = SOURCES[source_name(category, domain)]
        assert (cls.category, cls.domain) == (category, domain)
        assert cls().available_splits() == list(CANONICAL_SPLITS)


def test_records_follow_the_schema():
    source = SOURCES["synth_harmless_finance"](n_train=40, n_validation=10, n_test=20, seed=2, difficulty="hard")
    for split, n in [("train", 40), ("validation", 10), ("test", 20)]:
        loaded = source.load(split)
        rows = source.rows(split)
        assert len(loaded.records) == n and not loaded.dropped
        assert "seed=2" in loaded.origin
        for record, row in zip(loaded.records, rows):
            assert tuple(record) == RECORD_KEYS
            assert record["id"] == f"synth_harmless_finance/{split}/{row['index']}"
            assert (record["source"], record["split"]) == ("synth_harmless_finance", split)
            assert record["prompt"] == [{"role": "user", "content": row["prompt"]}]
            assert (record["chosen"], record["rejected"]) == (row["chosen"], row["rejected"])
            assert record["chosen"] != record["rejected"] and record["chosen"].strip()
        assert len({r["id"] for r in loaded.records}) == n


def test_build_source_passes_options():
    pytest.importorskip("datamodules.preference.sources.hub")  # build_source imports every builtin source module
    from datamodules.preference.sources import build_source

    source = build_source("synth_helpful_travel", n_test=30, artifact_rate=1.0)
    records = source.load("test").records
    assert len(records) == 30 and all(has_artifact("helpful", r["chosen"]) for r in records)


# ---- vocabulary and the lexicon's invariants -----------------------------------------------------------------
def test_generated_text_uses_only_the_vocabulary():
    vocab = set(synthetic_vocabulary())
    used = set()
    for category, domain in DOMAINS:
        for difficulty in ("easy", "hard"):
            for r in generate_domain(category, domain, "train", n_train=400, difficulty=difficulty):
                for text in (r["prompt"], r["chosen"], r["rejected"]):
                    used.update(split_words(text))
    assert used <= vocab, sorted(used - vocab)[:20]
    assert len(used) / len(vocab) > 0.95  # the vocabulary is not padded with words never emitted
    assert synthetic_vocabulary() == sorted(vocab) and "certainly" in vocab and "!" in vocab


def test_split_words_matches_the_hf_whitespace_pretokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    normalizer = tokenizers.normalizers.Lowercase()
    pre = tokenizers.pre_tokenizers.Whitespace()
    rows = generate_domain("harmless", "cyber", "test", n_test=50) + generate_domain("helpful", "travel", "test", n_test=50)
    for r in rows:
        for text in (r["prompt"], r["chosen"]):
            assert [w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))] == split_words(text)


def _lexicon_words(value):
    out = set()
    if isinstance(value, str):
        return set(split_words(re.sub(r"\{\w+\}", " ", value)))
    for v in value.values() if isinstance(value, dict) else value:
        out |= _lexicon_words(v)
    return out


@pytest.mark.parametrize("category,domain", DOMAINS)
def test_topic_words_appear_only_where_the_topic_is_named(category, domain):
    table = (lex.HELPFUL_DOMAINS if category == "helpful" else lex.HARMLESS_DOMAINS)[domain]
    topics = table["topics" if category == "helpful" else "items"]
    shared = ([lex.SHARED_LEADS, lex.HELPFUL_RESPONSES] if category == "helpful" else
              [lex.SHARED_LEADS, lex.HARMLESS_PROMPTS, lex.HARMLESS_REFUSALS, lex.HARMLESS_ANSWERS, lex.HARMLESS_HEDGED])
    other_text = _lexicon_words([v for k, v in table.items() if k not in ("topics", "items")] + shared)
    for literal, paraphrase in topics:
        words = set(topic_words(literal))
        assert words and not words & other_text, (literal, words & other_text)
        assert not words & _lexicon_words(paraphrase), (literal, paraphrase)
        others = [t for t in topics if t[0] != literal]
        assert not words & _lexicon_words(others), literal


def test_base_text_has_no_artifact_marks():
    # "!" and apostrophes only come from the enthusiasm artifact, so detection by phrase is exact
    base = _lexicon_words([lex.HELPFUL_DOMAINS, lex.HARMLESS_DOMAINS, lex.HELPFUL_RESPONSES, lex.HARMLESS_PROMPTS,
                           lex.HARMLESS_REFUSALS, lex.HARMLESS_ANSWERS, lex.HARMLESS_HEDGED, lex.SHARED_LEADS])
    assert "!" not in base and "'" not in base
    assert not base & {"certainly", "absolutely", "hope"}
