"""The weak teacher's fitted recipe (issue 29, protocols/w2s/teacher_search.py): the selection rule on hand-built
candidates, the spec's checks, and the protocol's teacher stage running the search — every candidate's figures
recomputed from its checkpoint, the chosen one read by the students, the search part of the stage's identity."""
import json
import os

import pytest

from protocols.w2s.shortcut_probe import ShortcutProbe, load_split_records, split_structure
from protocols.w2s.teacher_search import TeacherSearch, choose, stops, teacher_margins, value_label
from protocols.w2s.protocol import StageChangedError, main as run_protocol
from tests.test_w2s_protocol import _tiny_protocol, _write


def cand(acc, pairs=40, share=80.0, base=15.0, val=90.0, value=None):
    return {"value": value, "probe_wrong_acc": acc, "probe_wrong_pairs": pairs, "shortcut_error_share": share,
            "probe_wrong_share": base, "val_acc": val}


def test_choose_keeps_the_in_band_candidate_closest_to_the_target():
    spec = TeacherSearch(values=[1, 2, 3, 4], target=40.0, band=[20.0, 60.0])
    # 0 % (imitated), 35 % and 52 % (partial), 90 % (a rule teacher): 35 is 5 from the target, 52 is 12.
    index, rule = choose([cand(0.0), cand(35.0), cand(52.0), cand(90.0)], spec)
    assert index == 1 and "closest to 40%" in rule
    # equally far: the earlier (cheaper) candidate
    assert choose([cand(30.0), cand(50.0)], spec)[0] == 0


def test_choose_skips_candidates_whose_errors_do_not_concentrate_where_the_probe_is_wrong():
    spec = TeacherSearch(values=[1, 2], target=40.0)
    # 40 % right there, but only 10 % of its errors there against 15 % of the pairs: noise, not the shortcut
    spread = cand(40.0, share=10.0, base=15.0)
    assert choose([spread, cand(25.0)], spec)[0] == 1
    # nothing in the band: the closest is kept and the rule says the structure is missed
    index, rule = choose([cand(0.0), cand(95.0), cand(70.0)], spec)
    assert index == 2 and "structure is missed" in rule


def test_choose_keeps_the_first_candidate_where_the_probe_finds_no_misleading_pairs():
    spec = TeacherSearch(values=[1, 2, 3], min_pairs=10)
    # the synthetic harmless source: the probe is right on every validation pair (the search fits one candidate)
    index, rule = choose([cand(None, pairs=0, share=None, base=0.0, val=100.0)], spec)
    assert index == 0 and rule.startswith("instrument blind")
    # 9 pairs is below min_pairs too, even with a figure
    assert choose([cand(40.0, pairs=9, val=80.0), cand(0.0, pairs=9, val=85.0)], spec)[0] == 0


def test_search_stops_below_the_band_only_after_an_eligible_candidate():
    spec = TeacherSearch(values=[None, 20000, 14000, 10000])
    # full vocabulary 62 %, 20k 34 % (eligible), 14k 1 %: below the band after an eligible one, stop
    assert not stops([cand(62.0)], spec) and not stops([cand(62.0), cand(34.0)], spec)
    assert stops([cand(62.0), cand(34.0), cand(1.0)], spec)
    # below the band straight from one above it: the knee may lie between, nothing eligible yet, go on
    assert not stops([cand(75.0), cand(5.0)], spec)


@pytest.mark.parametrize("kwargs, message", [
    (dict(flag="vocab_limit"), "must be a cli.py flag"),
    (dict(values=[]), "values is empty"),
    (dict(values=[5, 5]), "repeats a value"),
    (dict(target=70.0, band=[20.0, 60.0]), "band"),
    (dict(min_pairs=0), "min_pairs"),
])
def test_bad_search_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TeacherSearch(**kwargs)


def test_candidate_flags_and_labels():
    spec = TeacherSearch(values=[14000, None])
    assert spec.candidate_args(14000) == ["--model.vocab_limit=14000"]
    assert spec.candidate_args(None) == ["--model.vocab_limit=null"]
    assert [value_label(v) for v in spec.values] == ["14000", "full"]


def test_protocol_teacher_stage_runs_the_search_and_students_read_the_chosen_teacher(tmp_path, word_tokenizer_dir,
                                                                                     cache_dir):
    search = {"flag": "--trainer.max_steps", "values": [1, 12], "target": 40.0, "band": [0.0, 100.0],
              "min_pairs": 1}
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, teacher_search=search)
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    teacher = json.load(open(os.path.join(cfg["out_dir"], "seed0", "teacher", "result.json")))
    record = teacher["teacher_search"]
    assert [c["value"] for c in record["candidates"]] == [1, 12]
    for c in record["candidates"]:  # each candidate fitted in its own folder under the stage
        assert c["checkpoint"].startswith(os.path.join(cfg["out_dir"], "seed0", "teacher", "search",
                                                       f"max_steps={c['value']}"))

    # every candidate's figures, recomputed from its checkpoint and a probe fitted on the teacher half
    data_init = {"source": "synth_helpful_cooking", "ood_targets": [], "tokenizer": word_tokenizer_dir,
                 "max_length": 96, "cache_dir": cache_dir,
                 "source_options": {"synth_helpful_cooking": {"n_train": 160, "n_validation": 24, "n_test": 33}}}
    records, dm = load_split_records(data_init, 0)
    probe = ShortcutProbe.fit(records["train_teacher"], seed=0)
    for c in record["candidates"]:
        s = split_structure(teacher_margins(c["checkpoint"], records["validation"], dm),
                            probe.margins(records["validation"]))
        assert (c["probe_wrong_acc"], c["probe_wrong_pairs"], c["teacher_acc"]) == (
            s["probe_wrong"]["teacher_acc"], s["probe_wrong"]["pairs"], s["teacher_acc"])
    index, rule = choose(record["candidates"], TeacherSearch(**search))
    assert record["chosen"] == record["candidates"][index]["value"] and record["rule"] == rule
    assert teacher["checkpoint"] == record["candidates"][index]["checkpoint"]
    assert f"--trainer.max_steps={record['chosen']}" in teacher["args"]
    # the chosen teacher's structure on the student half and the test splits, and the students read that teacher
    assert set(teacher["teacher_structure"]["structure"]) >= {"train_student", "test/synth_helpful_cooking"}
    naive = json.load(open(os.path.join(cfg["out_dir"], "seed0", "naive", "result.json")))
    assert f"--data.teacher_checkpoint={teacher['checkpoint']}" in naive["args"]
    assert results["teacher_search"][0]["chosen"] == record["chosen"]
    assert f"--trainer.max_steps = **{record['chosen']}**" in results["markdown"]
    # the search's lines sit above the table, the structure table below it: the run's first table is the results'
    from tests.doc_tables import first_table, parse_table

    assert set(parse_table(first_table(results["markdown"]))) == {"teacher", "naive"}
    assert "The chosen teacher's structure" in results["markdown"].split("| naive |", 1)[1]

    # the search is part of the teacher's identity: other candidates are another teacher
    with pytest.raises(StageChangedError, match=r"search\.values"):
        run_protocol(["--config", _write(tmp_path, dict(cfg, teacher_search={**search, "values": [1, 6]}))])


def test_search_and_an_outside_teacher_are_refused_together(tmp_path, word_tokenizer_dir, cache_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, teacher_search={"values": [1, 2]},
                         teacher_pretrained="hf_classifier:/nonexistent", teacher_configs=[])
    with pytest.raises(ValueError):
        run_protocol(["--config", _write(tmp_path, cfg)])


def test_regime_table_rows_from_results_files(tmp_path):
    """One row per benchmark: the search's choices, the student-half structure, teacher ID acc, naive WRG and its
    worst AOG with t-intervals, NTS per method, and which clause of the failure holds — from results.json."""
    from protocols.w2s.regime_table import main as regime_table

    cell = lambda *v: {"per_seed": {str(i): x for i, x in enumerate(v)}}  # noqa: E731
    structure = lambda acc, share, base: {"structure": {"train_student": {  # noqa: E731
        "probe_wrong": {"teacher_acc": acc}, "shortcut_error_share": share, "probe_wrong_share": base}},
        "probe": {"shortcut_strength": 84.0}}
    results = {"id_source": "src", "targets": ["a", "b"], "seeds": [0, 1, 2],
               "teacher_search": {str(s): {"chosen": v} for s, v in enumerate([20000, None, 20000])},
               "teacher_structure": {str(s): structure(*v) for s, v in enumerate([(40, 80, 14), (30, 90, 14),
                                                                                   (35, 85, 14)])},
               "rows": {"teacher": {"acc/src": cell(85.0, 86.0, 87.0)},
                        "naive": {"wrg": cell(3.0, 1.0, 2.0), "aog/a": cell(1.0, 2.0, 3.0),
                                  "aog/b": cell(-5.0, -3.0, -4.0), "nts": cell(0.0, 1.0, 2.0)},
                        "anchor": {"nts": cell(5.0, 6.0, 7.0)}}}
    os.makedirs(tmp_path / "run" / "results")
    json.dump(results, open(tmp_path / "run" / "results" / "results.json", "w"))
    json.dump({"stages": {}}, open(tmp_path / "run" / "results" / "set.json", "w"))  # a set that read no stage
    text = regime_table(["--run", f"bench={tmp_path / 'run'}"])
    row = text.splitlines()[2].split(" | ")
    # t(2) = 4.303; WRG 2.0 ± 1.0 → half width 4.303 / sqrt(3) = 2.484; worst AOG is b: −4.0 ± 1.0
    assert row[2:7] == ["20000, full, 20000", "84.0 ± 0.0", "35.0 ± 5.0", "85.0 ± 5.0 / 14.0 ± 0.0", "86.0 ± 1.0"]
    assert row[7] == "+2.0 [-0.5, +4.5]" and row[8] == "-4.0 [-6.5, -1.5] (b)"
    assert row[9:11] == ["+1.0 ± 1.0", "+6.0 ± 1.0"] and row[11].startswith("amplifies the shortcut")
    results["rows"]["naive"]["wrg"] = cell(-1.0, -2.0, 0.0)  # no ID gain: the clause that fails is named
    json.dump(results, open(tmp_path / "run" / "results" / "results.json", "w"))
    text = regime_table(["--run", f"bench={tmp_path / 'run'}"])
    assert "naive WRG > 0: no; some AOG < 0: yes (interval excludes 0)" in text


def test_replay_of_a_finished_search_decides_whether_a_new_option_came_into_play():
    from protocols.w2s.teacher_search import replays_the_same

    spec = TeacherSearch(values=[None, 20000, 14000])
    # recorded before budget_factors existed: full 62.5, 20k 34.4 (chosen), 14k 0 — the same walk and choice today
    done = {"candidates": [dict(cand(62.5), checkpoint="a"), dict(cand(34.4), checkpoint="b"),
                           dict(cand(0.0), checkpoint="c")], "checkpoint": "b", "rule": "closest"}
    assert replays_the_same(done, spec)
    # every candidate below the band: today's search would train longer, so it is another search
    low = {"candidates": [dict(cand(14.3), checkpoint="a")], "checkpoint": "a", "rule": "no candidate"}
    assert not replays_the_same(low, spec) and replays_the_same(low, TeacherSearch(values=[None], budget_factors=[]))
    # an old walk that went on below the band where today's stops: fitted more than today's would
    assert not replays_the_same({"candidates": [dict(cand(10.0), checkpoint="a"), dict(cand(5.0), checkpoint="b")],
                                 "checkpoint": "a", "rule": "x"}, TeacherSearch(values=[None, 1], budget_factors=[]))
    blind = {"candidates": [dict(cand(None, pairs=0, share=None), checkpoint="a")], "checkpoint": "a",
             "rule": "instrument blind: ..."}
    assert replays_the_same(blind, spec)


def test_search_trains_longer_when_even_the_most_capable_teacher_is_below_the_band(monkeypatch, word_tokenizer_dir,
                                                                                     cache_dir):
    """On data where the full-capacity teacher follows the rule on 10% of the misleading validation pairs, smaller
    vocabularies are not fitted; the vocabulary is walked down again at 2x the epochs, with the same rules."""
    import protocols.w2s.teacher_search as ts

    data_init = {"source": "synth_helpful_cooking", "ood_targets": [], "tokenizer": word_tokenizer_dir,
                 "max_length": 96, "cache_dir": cache_dir,
                 "source_options": {"synth_helpful_cooking": {"n_train": 400, "n_validation": 120, "n_test": 33}}}
    records, _ = load_split_records(data_init, 0)
    probe = ShortcutProbe.fit(records["train_teacher"], seed=0).margins(records["validation"])
    wrong = [i for i, m in enumerate(probe) if m < 0]
    # right on this share of the probe-wrong pairs, per (vocabulary, epochs)
    rule_share = {"null@2": 0.1, "null@4": 0.75, "20000@4": 0.35, "14000@4": 0.1}

    def margins(ckpt, recs, dm):  # right everywhere the probe is right, and on a share of where it is wrong
        right = set(wrong[:round(rule_share[ckpt] * len(wrong))])
        return [1.0 if (m > 0 or i in right) else -1.0 for i, m in enumerate(probe)]

    fits = []

    def fit(extra, folder):
        fits.append(extra)
        vocab = extra[0].split("=")[1]
        epochs = next((a.split("=")[1] for a in extra if a.startswith("--trainer.max_epochs")), "2")
        return f"{vocab}@{epochs}", 80.0

    monkeypatch.setattr(ts, "teacher_margins", margins)
    spec = TeacherSearch(values=[None, 20000, 14000, 10000], budget_factors=[2, 4], min_pairs=1)
    record = ts.run_search(spec, "/tmp/unused", [], data_init, 0, fit, max_epochs=2)
    assert fits == [["--model.vocab_limit=null"], ["--model.vocab_limit=null", "--trainer.max_epochs=4"],
                    ["--model.vocab_limit=20000", "--trainer.max_epochs=4"],
                    ["--model.vocab_limit=14000", "--trainer.max_epochs=4"]]
    assert record["chosen"] == 20000 and record["chosen_budget"] == 2 and record["checkpoint"] == "20000@4"
    assert record["chosen_args"] == ["--model.vocab_limit=20000", "--trainer.max_epochs=4"]
    assert [c["budget"] for c in record["candidates"]] == [1, 2, 2, 2]
