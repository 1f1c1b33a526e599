"""The two generated benchmarks written in hub schemas (docs/hub_benchmarks.md): they load through the hub adapters
with `--data.local_dirs`, keep exactly the generated pairs after the intended drops, carry the cue at the documented
rates, keep prompts apart across splits, are deterministic, and their rule needs the prompt."""
import filecmp
import glob
import json
import os

import pytest

from datamodules.preference import synthetic_advice as advice
from datamodules.preference import synthetic_advice_lexicon as advice_lex
from datamodules.preference import synthetic_lexicon, synthetic_shift
from datamodules.preference.datamodule import PreferenceDataModule
from datamodules.preference.write_hub_benchmark import BENCHMARKS, SHIFT_ACKNOWLEDGEMENTS, build_benchmark, main

# (source, ood_targets) of configs/data/bench_*.yaml, and P(cue on chosen) per schema in layout order
CONFIGS = {"advice": ("ultrafeedback", ["hh_helpful", "helpsteer3", "rail"]),
           "helpful_hard_hub": ("hh_helpful", ["helpsteer3", "ultrafeedback", "rail"])}
RATES = [0.85, 0.5, 0.15, None]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_CUE = {"advice": advice.has_cue, "helpful_hard_hub": lambda text: synthetic_shift.has_artifact("helpful", text)}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each benchmark at its default sizes: (manifest, records, report) as the data module loads them."""
    out = {}
    for benchmark, (source, targets) in CONFIGS.items():
        folder = str(tmp_path_factory.mktemp(benchmark))
        manifest = main(["--benchmark", benchmark, "--out", folder])
        dm = PreferenceDataModule(source=source, ood_targets=targets, local_dirs=manifest["local_dirs"],
                                  cache_dir=str(tmp_path_factory.mktemp("cache")))
        records, report = dm.load_records()
        out[benchmark] = (manifest, records, report)
    return out


def _by_schema(records: dict, source: str) -> dict[str, dict[str, list[dict]]]:
    """{schema: {canonical split: records}}; the source's train = teacher + student halves + carved validation."""
    out = {source: {"train": records["train_teacher"] + records["train_student"] + records["validation"]}}
    for kind, recs in records.items():
        if kind.startswith("test/"):
            out.setdefault(kind[len("test/"):], {})["test"] = recs
    return out


def test_configs_name_the_written_schemas():
    import yaml

    for benchmark, (source, targets) in CONFIGS.items():
        init = yaml.safe_load(open(os.path.join(ROOT, BENCHMARKS[benchmark]["config"])))["data"]["init_args"]
        assert (init["source"], init["ood_targets"], init["max_length"]) == (source, targets, 128)
        assert [schema for _, schema, _ in BENCHMARKS[benchmark]["layout"]] == [source, *targets]


@pytest.mark.parametrize("benchmark", list(CONFIGS))
def test_pair_counts_after_the_intended_drops(written, benchmark):
    manifest, records, report = written[benchmark]
    n_train = BENCHMARKS[benchmark]["n_train"]
    source, targets = CONFIGS[benchmark]
    assert len(records["train_teacher"]) + len(records["train_student"]) + len(records["validation"]) == n_train
    assert {t: len(records[f"test/{t}"]) for t in [source, *targets]} == {t: 300 for t in [source, *targets]}
    # every written drop row is dropped, for the reason it was written with (2% of the kept pairs)
    expected = {f"{name.split('/')[0]}/{f['split']}": f["dropped"] for name, f in manifest["files"].items()}
    assert report["dropped"] == expected
    train = expected[f"{source}/train"]
    assert sum(train.values()) == round(0.02 * n_train)
    hh = "identical" if source == "hh_helpful" else "tie"
    assert set(train) == {"duplicate", "empty", hh} and min(train.values()) >= round(0.02 * n_train) // 3


@pytest.mark.parametrize("benchmark", list(CONFIGS))
def test_loaded_pairs_are_the_generated_pairs(written, benchmark):
    """Each schema's writer and adapter round-trip: same prompt turns, and chosen stays chosen (sign conventions)."""
    manifest, records, _ = written[benchmark]
    built = build_benchmark(benchmark)
    loaded = _by_schema(records, CONFIGS[benchmark][0])
    for (schema, _), part in built.items():
        got = {(json.dumps(r["prompt"]), r["chosen"], r["rejected"]) for r in loaded[schema][part["split"]]}
        assert got == {(json.dumps(p["prompt"]), p["chosen"], p["rejected"]) for p in part["pairs"]}
        turns = [len(p["prompt"]) for p in part["pairs"]]
        assert set(turns) == {1, 3} and 0.2 < turns.count(3) / len(turns) < 0.5  # multi-turn where a lead allows
        if schema == "helpsteer3":  # the chosen response is response1 (negative preference) about half the time
            kept = [r for r in part["rows"] if r["overall_preference"] != 0 and r["response1"].strip()
                    and r["response2"].strip()]
            negative = sum(r["overall_preference"] < 0 for r in kept) / len(kept)
            assert 0.4 < negative < 0.6 and {abs(r["overall_preference"]) for r in kept} == {1, 2, 3}


@pytest.mark.parametrize("benchmark", list(CONFIGS))
def test_cue_rates_per_domain(written, benchmark):
    _, records, _ = written[benchmark]
    has_cue = HAS_CUE[benchmark]
    loaded = _by_schema(records, CONFIGS[benchmark][0])
    for (_, schema, role), rate in zip(BENCHMARKS[benchmark]["layout"], RATES):
        for split, recs in loaded[schema].items():
            marks = [(has_cue(r["chosen"]), has_cue(r["rejected"])) for r in recs]
            if rate is None:
                assert not any(c or r for c, r in marks), schema
                continue
            assert all(c != r for c, r in marks), schema  # exactly one response carries the cue
            measured = sum(c for c, _ in marks) / len(marks)
            tolerance = 0.03 if len(marks) > 1000 else 0.07  # ~3.5 standard errors at 1600 / 300 pairs
            assert abs(measured - rate) < tolerance, (schema, split, measured)


@pytest.mark.parametrize("benchmark", list(CONFIGS))
def test_prompts_never_shared_by_two_splits(written, benchmark):
    _, records, _ = written[benchmark]
    text = [{json.dumps(r["prompt"]) for r in records[k]} for k in ("train_teacher", "train_student", "validation")]
    test = {json.dumps(r["prompt"]) for r in records[f"test/{CONFIGS[benchmark][0]}"]}
    assert not (text[0] | text[1] | text[2]) & test
    if benchmark == "advice":  # one pair per prompt and a split per request: stricter than the shipped generator
        assert not text[0] & text[1] and not (text[0] | text[1]) & text[2]
        requests = [{r["prompt"][-1]["content"] for r in records[k]}
                    for k in ("train_teacher", "train_student", "validation", f"test/{CONFIGS[benchmark][0]}")]
        assert not (requests[0] | requests[1] | requests[2]) & requests[3]


@pytest.mark.parametrize("benchmark", list(CONFIGS))
def test_same_seed_same_bytes_other_seed_other_files(tmp_path, benchmark):
    small = ["--benchmark", benchmark, "--n_train", "150", "--n_test", "50"]
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        main(small + ["--out", str(tmp_path / name), "--seed", seed])
    files = sorted(os.path.relpath(p, tmp_path / "a") for p in glob.glob(str(tmp_path / "a" / "*" / "*.jsonl")))
    assert len(files) == 5
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files, shallow=False)
    assert (match, errors) == (files, [])
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "c", files, shallow=False)
    assert (mismatch, errors) == (files, [])


def test_advice_rule_needs_the_prompt(written):
    """The chosen response names the prompt's subject; the rejected one another subject of the same domain."""
    _, records, _ = written["advice"]
    loaded = _by_schema(records, "ultrafeedback")
    for domain, schema, _ in BENCHMARKS["advice"]["layout"]:
        others = []
        for recs in loaded[schema].values():
            for r in recs:
                [subject] = advice.subjects_in(r["prompt"][-1]["content"], domain)
                assert advice.subjects_in(r["chosen"], domain) == [subject]
                [other] = advice.subjects_in(r["rejected"], domain)
                assert other != subject
                others.append(other)
        # rejected subjects come from the whole list, so a response alone does not tell which side it is on
        assert len(set(others)) > 0.9 * len(advice_lex.DOMAINS[domain]["subjects"])


def test_advice_lexicon_invariants():
    words = synthetic_shift.split_words
    cue = advice_lex.CUE_OPENERS + advice_lex.CUE_CLOSERS
    shipped = {x.lower() for d in synthetic_lexicon.HELPFUL_DOMAINS.values() for t in d["topics"] for x in t}
    function_words = {"a", "an", "as", "by", "from", "on", "the", "this", "to", ":", ".", "(", ")"}
    outside_cue = set(advice_lex.SHARED_LEADS + advice_lex.ACKNOWLEDGEMENTS)
    for domain, table in advice_lex.DOMAINS.items():
        rest = [s for k, v in table.items() if k != "subjects" for s in synthetic_shift._strings(v)]
        outside_cue |= set(rest)
        rest_words = {w for s in rest + list(advice_lex.SHARED_LEADS + advice_lex.ACKNOWLEDGEMENTS + cue)
                      for w in words(s)}
        subjects = table["subjects"]
        assert 40 <= len(set(subjects)) == len(subjects) <= 60, domain
        for s in subjects:
            own = set(words(s)) - {"-"}
            assert not own & rest_words, (domain, s)
            assert not own & {w for o in subjects if o != s for w in words(o)}, (domain, s)
            assert s.lower() not in shipped, s
    # the cue's words occur nowhere else (beyond function words), and no cue string is the shipped artifact's
    assert {w for s in outside_cue for w in words(s)} & {w for c in cue for w in words(c)} <= function_words
    assert not set(cue) & set(synthetic_lexicon.ENTHUSIASM_OPENERS + synthetic_lexicon.ENTHUSIASM_CLOSERS)


def test_advice_cue_is_read_from_the_text_and_the_vocabulary_is_closed():
    vocabulary, emitted = set(advice.advice_vocabulary()), set()
    for domain in advice.DOMAINS:
        for split in ("train", "test"):
            for row in advice.generate_domain(domain, split, 300, seed=3):
                if row["cue_on_chosen"] is None:
                    assert not advice.has_cue(row["chosen"]) and not advice.has_cue(row["rejected"])
                else:
                    assert advice.has_cue(row["chosen"]) == row["cue_on_chosen"] != advice.has_cue(row["rejected"])
                for text in (row["prompt"], row["chosen"], row["rejected"]):
                    emitted.update(synthetic_shift.split_words(text))
    assert emitted <= vocabulary and len(emitted) > 0.9 * len(vocabulary)
    # a rate change moves cues and nothing else
    a, b = (advice.generate_domain("fitness", "test", 50, cue_rate=r) for r in (0.2, 0.9))
    assert [x["prompt"] for x in a] == [x["prompt"] for x in b]
    for side in ("chosen", "rejected"):
        assert [_without_cue(x[side]) for x in a] == [_without_cue(y[side]) for y in b]


def _without_cue(text: str) -> str:
    for opener in advice_lex.CUE_OPENERS:
        text = text[len(opener) + 1:] if text.startswith(opener + " ") else text
    for closer in advice_lex.CUE_CLOSERS:
        text = text[:-len(closer) - 1] if text.endswith(" " + closer) else text
    return text


def test_shift_acknowledgements_stay_in_the_shipped_vocabulary():
    vocabulary = set(synthetic_shift.synthetic_vocabulary())
    assert {w for a in SHIFT_ACKNOWLEDGEMENTS for w in synthetic_shift.split_words(a)} <= vocabulary


def test_one_benchmark_per_folder(tmp_path, capsys):
    main(["--benchmark", "advice", "--out", str(tmp_path), "--n_train", "20", "--n_test", "10"])
    with pytest.raises(SystemExit):
        main(["--benchmark", "helpful_hard_hub", "--out", str(tmp_path), "--n_train", "20", "--n_test", "10"])
    assert "holds the 'advice' benchmark" in capsys.readouterr().err
