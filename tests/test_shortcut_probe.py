"""The response-only shortcut probe and the teacher structure read from it (protocols/w2s/shortcut_probe.py, issue 29)."""
import json
import os
import random

import pytest
import yaml

from protocols.w2s.shortcut_probe import ShortcutProbe, markdown, split_structure
from tests.helpers import synth_options, tiny_teacher_checkpoint

TOPICS = ["pasta", "bread", "rice", "soup", "salad", "cake", "curry", "tofu", "beans", "pizza", "noodles", "fish"]
FILLER = ["first", "then", "slowly", "gently", "warm", "fresh", "simple", "quick", "small", "large", "clean", "dry"]
CUE = "certainly"


def cue_pairs(n: int, split: str, cue_rate: float = 0.9, cue: bool = True, seed: int = 0) -> list[dict]:
    """Pairs whose rule needs the prompt: the chosen response is about the prompt's topic, the rejected about
    another topic drawn from the same list (so a response alone says nothing about which is right). With `cue`, the
    cue word opens the chosen response in exactly `cue_rate` of the pairs (every pair but each tenth at 0.9) and
    the rejected one in the rest."""
    rng = random.Random(f"{split}/{seed}")
    period = round(1 / (1 - cue_rate)) if cue_rate < 1 else None
    out = []
    for i in range(n):
        topic, other = rng.sample(TOPICS, 2)
        chosen = f"for {topic} use {' '.join(rng.sample(FILLER, 3))} steps"
        rejected = f"for {other} use {' '.join(rng.sample(FILLER, 3))} steps"
        on_chosen = period is None or i % period != 0
        if cue:
            chosen, rejected = (f"{CUE} {chosen}", rejected) if on_chosen else (chosen, f"{CUE} {rejected}")
        out.append({"id": f"hand/{split}/{i}", "prompt": [{"role": "user", "content": f"how do I cook {topic}?"}],
                    "chosen": chosen, "rejected": rejected, "cue_on_chosen": on_chosen})
    return out


@pytest.fixture(scope="module")
def cue_probe():
    return ShortcutProbe.fit(cue_pairs(400, "train"), seed=0)


def test_probe_learns_the_cue_and_nothing_else(cue_probe):
    """Cue on the chosen response in 90% of pairs, rule in the prompt: held-out probe accuracy is the cue's rate."""
    test = cue_pairs(400, "test")
    margins = cue_probe.margins(test)
    assert [m > 0 for m in margins] == [r["cue_on_chosen"] for r in test]  # it predicts the cue side, every pair
    assert cue_probe.accuracy(test) == pytest.approx(90.0)
    # the same pairs without the cue: the responses alone carry nothing, chance
    plain = ShortcutProbe.fit(cue_pairs(400, "train", cue=False), seed=0)
    assert 40.0 <= plain.accuracy(cue_pairs(400, "test", cue=False)) <= 60.0


def test_probe_never_reads_the_prompt_and_does_not_depend_on_the_coin(cue_probe):
    test = cue_pairs(50, "test")
    other_prompts = [{**r, "prompt": [{"role": "user", "content": "something else entirely"}]} for r in test]
    assert cue_probe.margins(other_prompts) == cue_probe.margins(test)
    # antisymmetric and intercept-free: flipping a pair flips features and label, so the seeded order is moot
    train = cue_pairs(200, "train")
    w0 = ShortcutProbe.fit(train, seed=0, l2=1e-2).weights
    w1 = ShortcutProbe.fit(train, seed=1, l2=1e-2).weights
    assert float((w0 - w1).abs().max()) < 1e-6 and float(w0.abs().max()) > 0.1
    assert cue_probe.l2 in (1e-4, 1e-3, 1e-2, 1e-1)


# Hand-built teachers of known structure, given as margins. 100 pairs; the probe is wrong on each tenth (10 pairs).
PROBE = [-1.0 if i % 10 == 0 else 1.0 for i in range(100)]
PROBE_WRONG = [i for i in range(100) if i % 10 == 0]


def test_shortcut_only_teacher_errs_exactly_where_the_probe_does():
    s = split_structure(list(PROBE), PROBE)  # margin = the cue side
    assert s["teacher_acc"] == 90.0 and s["probe_acc"] == 90.0
    assert s["probe_wrong"] == {"pairs": 10, "teacher_acc": 0.0}
    assert s["probe_right"] == {"pairs": 90, "teacher_acc": 100.0}
    assert (s["teacher_errors"], s["shortcut_errors"], s["shortcut_error_share"]) == (10, 10, 100.0)
    assert s["probe_wrong_share"] == 10.0 and s["probe_undecided"] == 0


def test_rule_only_teacher_is_right_everywhere():
    s = split_structure([1.0] * 100, PROBE)  # margin = gold
    assert s["teacher_acc"] == 100.0
    assert s["probe_wrong"] == {"pairs": 10, "teacher_acc": 100.0}
    assert s["probe_right"] == {"pairs": 90, "teacher_acc": 100.0}
    assert (s["teacher_errors"], s["shortcut_errors"], s["shortcut_error_share"]) == (0, 0, None)


def test_mixed_teacher_by_hand():
    """Rule on 6 of the 10 probe-wrong pairs (shortcut on the other 4), and 5 errors unrelated to the shortcut."""
    teacher = [1.0] * 100
    for i in PROBE_WRONG[6:]:  # 60, 70, 80, 90: follows the cue against gold
        teacher[i] = -1.0
    for i in (1, 11, 21, 31, 41):  # wrong where the cue agrees with gold: not a shortcut error
        teacher[i] = -0.5
    s = split_structure(teacher, PROBE)
    assert s["probe_wrong"] == {"pairs": 10, "teacher_acc": 60.0}
    assert s["probe_right"]["pairs"] == 90 and s["probe_right"]["teacher_acc"] == pytest.approx(8500 / 90)
    assert s["teacher_acc"] == 91.0
    assert (s["teacher_errors"], s["shortcut_errors"]) == (9, 4)
    assert s["shortcut_error_share"] == pytest.approx(400 / 9)
    row = markdown({"test/x": s}).splitlines()[2]
    assert row == "| test/x | 91.0 (100) | 90.0 | 94.4 (90) | 60.0 (10) | 44.4 (4/9) | 10.0 |"


def test_ties_of_the_probe_are_undecided_and_lengths_must_match():
    s = split_structure([1.0, -1.0, 1.0], [0.0, 0.0, -2.0])
    assert s["probe_undecided"] == 2 and s["probe_wrong"] == {"pairs": 1, "teacher_acc": 100.0}
    assert s["probe_right"] == {"pairs": 0, "teacher_acc": None} and s["shortcut_errors"] == 0
    with pytest.raises(ValueError, match="2 teacher margins vs 1 probe margins"):
        split_structure([1.0, 1.0], [1.0])


def test_fitted_probe_reads_a_shortcut_teacher_from_margins(cue_probe):
    test = cue_pairs(200, "test")
    shortcut_teacher = [1.0 if r["cue_on_chosen"] else -1.0 for r in test]
    s = split_structure(shortcut_teacher, cue_probe.margins(test))
    assert (s["shortcut_error_share"], s["probe_wrong"]["teacher_acc"], s["probe_wrong"]["pairs"]) == (100.0, 0.0, 20)


def _synthetic(name: str, split: str, **options):
    from datamodules.preference.sources import build_source

    src = build_source(name, None, **options)
    return src, src.load(split).records


@pytest.mark.parametrize("teacher_rate", [None, 0.8])
def test_probe_wrong_pairs_are_the_artifact_on_rejected_pairs_on_the_synthetic_benchmark(teacher_rate):
    """Agreement with `protocols.w2s.teacher_structure`'s subsets where both run (generator metadata only here).

    Helpful category: the rejected response answers the same question about another topic of the domain, drawn
    from the same list as the chosen one's, so without the prompt the only signal is the artifact and the best
    response-only predictor is the artifact side. The fitted probe departs from it only through word weights
    fitted to 600 pairs' noise, small beside the artifact's; so on every domain with the artifact, nearly all
    artifact-on-rejected pairs are probe-wrong and nearly nothing else is (measured: Jaccard 1.000 at 0.85 and
    0.96-1.00 at 0.8; the bounds leave room for other seeds). Without the artifact (tech) the probe is at chance.
    """
    extra = {} if teacher_rate is None else {"artifact_rate": teacher_rate}
    _, train = _synthetic("synth_helpful_cooking", "train", n_train=600, **extra)
    src, val = _synthetic("synth_helpful_cooking", "validation", n_validation=200, **extra)
    probe = ShortcutProbe.fit(train, seed=0)
    artifact_on_chosen = 100.0 * sum(src.artifact_side(r) == "chosen" for r in val) / len(val)
    assert abs(probe.accuracy(val) - artifact_on_chosen) <= 3.0  # shortcut strength = the artifact's rate
    for name in ("synth_helpful_cooking", "synth_helpful_science", "synth_helpful_travel"):
        src, recs = _synthetic(name, "test", n_test=200)
        wrong = {r["id"] for r, m in zip(recs, probe.margins(recs)) if m <= 0}
        on_rejected = {r["id"] for r in recs if src.artifact_side(r) == "rejected"}
        assert len(wrong & on_rejected) / len(on_rejected) >= 0.95, name
        assert len(wrong & on_rejected) / len(wrong | on_rejected) >= 0.9, name
    _, tech = _synthetic("synth_helpful_tech", "test", n_test=200)
    assert 40.0 <= probe.accuracy(tech) <= 60.0


def test_where_quality_is_response_local_the_probe_learns_it_too():
    """Harmless category: which steps a response gives (dangerous vs safe) is readable without the prompt, so the
    probe beats the artifact's 85% on the source: its 'shortcut' there is genuine quality
    (docs/teacher_structure.md)."""
    _, train = _synthetic("synth_harmless_household", "train", n_train=600)
    _, val = _synthetic("synth_harmless_household", "validation", n_validation=200)
    assert ShortcutProbe.fit(train, seed=0).accuracy(val) >= 97.0


@pytest.fixture
def teacher_ckpt(tmp_path_factory, word_tokenizer_dir, cache_dir):
    return tiny_teacher_checkpoint(tmp_path_factory, word_tokenizer_dir, cache_dir)


def test_cli_agrees_with_teacher_structure_and_runs_on_a_hub_schema(tmp_path, teacher_ckpt, word_tokenizer_dir,
                                                                     cache_dir, capsys):
    from protocols.w2s import shortcut_probe, teacher_structure
    from tests.conftest import HUB_FIXTURES
    from tests.helpers import SOURCE, TARGETS

    config = tmp_path / "data.yaml"
    init = dict(source=SOURCE, ood_targets=TARGETS, tokenizer=word_tokenizer_dir, max_length=96, cache_dir=cache_dir)
    config.write_text(yaml.safe_dump({"data": {"init_args": init}}))
    opts = synth_options()
    out = shortcut_probe.main(["--ckpt", teacher_ckpt, "--data_config", str(config), "--source_options",
                               json.dumps(opts)])
    printed = capsys.readouterr().out
    assert "shortcut strength" in printed and "| train_student |" in printed
    reference = teacher_structure.measure(teacher_ckpt, {**init, "source_options": opts}, 0)
    assert set(out["structure"]) == set(reference) == {"train_student", *(f"test/{t}" for t in [SOURCE, *TARGETS])}
    for kind, s in out["structure"].items():  # same records, same teacher: the same accuracy and pair count
        assert (s["pairs"], s["teacher_acc"]) == (reference[kind]["all"]["pairs"], reference[kind]["all"]["acc"])
        assert s["probe_right"]["pairs"] + s["probe_wrong"]["pairs"] + s["probe_undecided"] == s["pairs"]
    assert out["probe"]["fit_pairs"] == 120 and out["probe"]["validation_pairs"] == 40
    # a hub-schema source read from local files: no artifact_side, no generator option, same instrument
    hub = dict(source="hh_helpful", ood_targets=[], tokenizer=word_tokenizer_dir, max_length=96, cache_dir=cache_dir,
               val_fraction=0.3)
    config.write_text(yaml.safe_dump({"data": {"init_args": hub}}))
    local = {"hh_helpful": os.path.join(HUB_FIXTURES, "hh_helpful")}
    out = shortcut_probe.main(["--ckpt", teacher_ckpt, "--data_config", str(config), "--local_dirs",
                               json.dumps(local)])
    records, _ = shortcut_probe.load_split_records({**hub, "local_dirs": local}, 0)
    assert {k: s["pairs"] for k, s in out["structure"].items()} == {
        "train_student": len(records["train_student"]), "test/hh_helpful": len(records["test/hh_helpful"])}
    assert out["probe"]["fit_pairs"] == len(records["train_teacher"]) >= 1
