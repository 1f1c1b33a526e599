"""The strict weak-to-strong rule `weak_val`, rows at a value fixed in advance, the budget table and the same-step
comparison (issue 36; protocols/w2s/model_selection.py, protocols/w2s/budget.py, callbacks/validation_history.py)."""
import json
import os

import pytest
import torch

from protocols.w2s.budget import budget
from protocols.w2s.model_selection import available, select
from protocols.w2s.protocol import main as run_protocol, parse
from tests.test_w2s_protocol import _tiny_protocol, _write


def test_weak_validation_accuracy_is_agreement_with_the_teacher_by_hand(word_tokenizer_dir):
    """val/weak_acc counts a pair right when the student's margin has the teacher's sign (a tie is wrong, as in
    val/acc); val/acc still reads gold (a = chosen)."""
    from lightning_modules.reward.reward_model import RewardModelModule

    module = RewardModelModule(backbone="tiny-qwen2", tokenizer=word_tokenizer_dir,
                               tiny_config={"num_hidden_layers": 1})
    student = torch.tensor([1.0, -2.0, 0.5, -0.1, 0.0])
    teacher = torch.tensor([2.0, 1.0, -1.0, -3.0, 4.0])
    module.pair_margins = lambda batch: student
    module.log = lambda *args, **kwargs: None
    module.validation_step({"index": torch.arange(5), "teacher_margin": teacher}, 0)
    # agree: yes, no, no, yes, no (the tie) -> 2/5; gold (a = chosen): 1, 0, 1, 0, 0 -> 2/5 as well, other pairs
    assert float(module.val_weak_acc.compute()) == pytest.approx(2 / 5)
    assert module.val_weak_acc.pair_outcomes[1].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert module.val_acc.compute().item() == pytest.approx(2 / 5)
    module.val_acc.reset()
    module.validation_step({"index": torch.arange(5)}, 0)  # no teacher margins: no weak update
    assert module.val_weak_acc.pair_outcomes[0].numel() == 5


def _protocol(tmp_path, methods):
    return parse(["--config", _write(tmp_path, {
        "out_dir": str(tmp_path / "run"), "trainer_configs": [], "data_configs": [], "student_configs": [],
        "teacher_configs": [__file__], "methods": methods, "paired_reference": None})])


def _stage(val, weak, test_acc, best=False, validations=None, weak_val=None):
    result = {"val_acc": val, "val_weak_acc": weak, "test": {"t": {"acc": test_acc}},
              "identity": {"checkpoint": "best" if best else "last"}}
    if validations is not None:
        result["validations"] = [{"step": s} for s in range(validations)]
    if weak_val is not None:
        result["weak_val"] = weak_val
    return result


def test_weak_val_picks_on_teacher_agreement_and_reads_early_stopping_at_its_own_point(tmp_path):
    p = _protocol(tmp_path, [
        {"name": "a", "sweep": {"--model.anchor_coef": [1.0, 2.0, 3.0]}},
        {"name": "a_fixed", "fixed": {"method": "a", "value": 2.0}},
        {"name": "es", "checkpoint": "best"},
        {"name": "wise", "from_method": "a", "args": ["--model.wise_ft_alpha=0.5"]}])
    raw = {"teacher": {0: {}},
           "a@anchor_coef=1.0": {0: _stage(90.0, 70.0, 0.1)},
           "a@anchor_coef=2.0": {0: _stage(80.0, 85.0, 0.2)},
           "a@anchor_coef=3.0": {0: _stage(85.0, 85.0, 0.3)},  # a weak tie: the earlier value wins
           "es": {0: _stage(95.0, 60.0, 0.4, best=True, validations=8,
                            weak_val={"val_acc": 70.0, "val_weak_acc": 99.0, "step": 3, "test": {"t": {"acc": 0.5}}})},
           "wise": {0: {**_stage(91.0, 91.0, 0.6), "evaluated": "a@anchor_coef=1.0"}}}
    rows, picked = select(p, raw, "id_val", ["t"])
    assert picked == {"a": {0: 1.0}} and list(rows) == ["teacher", "a", "es", "wise", "a_fixed"]
    assert rows["es"][0]["test"]["t"]["acc"] == 0.4 and rows["a_fixed"][0]["test"]["t"]["acc"] == 0.2
    rows, picked = select(p, raw, "weak_val", ["t"])
    assert picked == {"a": {0: 2.0}}
    assert rows["a"][0]["test"]["t"]["acc"] == 0.2
    assert rows["es"][0]["test"]["t"]["acc"] == 0.5 and rows["es"][0]["step"] == 3  # its weak_val stopping point
    assert "wise" not in rows  # nested on a's id_val pick: no weak_val row
    assert rows["a_fixed"][0]["test"]["t"]["acc"] == 0.2
    assert available(raw, p, "weak_val") == []
    # budget: a 3 fits / 3 candidates; es 1 fit, 8 validations; wise 1 evaluation + a's 3 (nested); fixed: 1 fit
    costs = budget(p, raw)
    assert {k: (v["fits"], v["evaluations"], v["candidates"]) for k, v in costs.items()} == {
        "a": (3, 0, 3), "es": (1, 0, 8), "wise": (0, 1, 4), "a_fixed": (1, 0, 1)}
    # an early-stopping stage from before the rule: its kept checkpoint was chosen on gold, so weak_val refuses it
    del raw["es"][0]["weak_val"]
    assert available(raw, p, "weak_val") == ["seed0/es"]
    with pytest.raises(ValueError, match="no val_weak_acc.*--force"):
        select(p, raw, "weak_val", ["t"])


@pytest.mark.parametrize("method, message", [
    ({"name": "f", "fixed": {"method": "a"}}, "fixed takes"),
    ({"name": "f", "fixed": {"method": "a", "value": 1.0}, "checkpoint": "best"}, "drop its \\['checkpoint'\\]"),
    ({"name": "f", "fixed": {"method": "b", "value": 1.0}}, "must name an earlier method with a sweep"),
    ({"name": "f", "fixed": {"method": "a", "value": 5.0}}, "is not among 'a'"),
])
def test_bad_fixed_rows_are_refused(tmp_path, method, message):
    with pytest.raises(ValueError, match=message):
        _protocol(tmp_path, [{"name": "a", "sweep": {"--model.anchor_coef": [1.0, 2.0]}}, {"name": "b"}, method])


def _result(out, seed, stage):
    with open(os.path.join(out, f"seed{seed}", stage, "result.json")) as f:
        return json.load(f)


def test_a_run_records_both_rules_and_the_same_step_table(tmp_path, word_tokenizer_dir, cache_dir):
    every = ["--trainer.val_check_interval=0.5", "--trainer.max_epochs=2"]
    methods = [{"name": "es", "objective": "naive", "checkpoint": "best", "args": every},
               {"name": "steps_naive", "objective": "naive", "test_every_validation": True, "args": every},
               {"name": "steps_anchor", "objective": "naive", "anchor_coef": 3.0, "test_every_validation": True,
                "args": every}]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, methods=methods, paired_reference="es")
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]
    for seed in (0,):
        es = _result(out, seed, "es")
        history = es["validations"]
        assert len(history) >= 3 and all(h["val_weak_acc"] is not None for h in history)
        # the weak_val stopping point: the highest agreement, ties to the earlier validation
        best = max(range(len(history)), key=lambda i: (history[i]["val_weak_acc"], -i))
        assert es["weak_val"]["step"] == history[best]["step"]
        assert es["weak_val"]["val_weak_acc"] == history[best]["val_weak_acc"]
        assert es["val_weak_acc"] == next(h["val_weak_acc"] for h in history if h["step"] == es["step"])
        assert not os.path.exists(os.path.join(out, f"seed{seed}", "steps_naive", "rule_checkpoints", "step2.ckpt"))
        steps = _result(out, seed, "steps_naive")
        assert sorted(steps["by_step"], key=int) == [str(h["step"]) for h in steps["validations"]]
        for step, entry in steps["by_step"].items():  # the kept (last) weights are tested once, if validated
            assert (entry["test"] == steps["test"]) == (int(step) == steps["step"])
    # the same-step table: per-seed NTS at each step from the stage files, and their paired difference
    table = results["same_step"]
    for step, cell in table["paired"]["steps"].items():
        assert cell["per_seed"]
        for seed, diff in cell["per_seed"].items():
            nts = {m: _result(out, int(seed), m)["by_step"][step]["test"]["transfer"]["nts"]
                   for m in ("steps_anchor", "steps_naive")}
            assert diff == pytest.approx(nts["steps_naive"] - nts["steps_anchor"])
    n = len(_result(out, 0, "es")["validations"])
    assert results["budget"]["es"]["candidates"] == n and results["budget"]["steps_naive"]["candidates"] == 1
    assert results["weak_val_missing"] == [] and set(results["weak_val_rows"]) == set(results["rows"])
    md = open(os.path.join(out, "results.md")).read()
    assert "Selection `weak_val`" in md and "Same-step comparison" in md and f"| es | 1 | 0 | {n} |" in md


@pytest.mark.slow  # a whole protocol run (15-25 s): make test-slow; the fast suite keeps its parts' unit tests
def test_ensemble_rows_combine_every_stage_of_the_named_methods(tmp_path, word_tokenizer_dir, cache_dir):
    """WARM and a prediction ensemble as protocol rows: no fit, one evaluation, the same row under both rules; the
    averaged checkpoint is the hand average of the members' weights."""
    methods = [{"name": "naive", "objective": "naive"},
               {"name": "anchor", "objective": "naive", "sweep": {"--model.anchor_coef": [1.0, 3.0]}},
               {"name": "warm", "ensemble": {"of": ["anchor"], "by": "weights"}},
               {"name": "ens", "ensemble": {"of": ["naive", "anchor"], "by": "predictions"}}]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, methods=methods, paired_reference="warm")
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]
    warm, ens = _result(out, 0, "warm"), _result(out, 0, "ens")
    assert warm["members"] == ["anchor@anchor_coef=1.0", "anchor@anchor_coef=3.0"]
    assert ens["members"] == ["naive", "anchor@anchor_coef=1.0", "anchor@anchor_coef=3.0"]
    members = [torch.load(_result(out, 0, n)["checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
               for n in warm["members"]]
    averaged = torch.load(warm["checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
    key = "head.score.weight"
    assert torch.allclose(averaged[key], (members[0][key] + members[1][key]) / 2)
    assert warm["val_weak_acc"] is not None and ens["val_acc"] is not None
    for row in ("warm", "ens"):
        assert results["budget"][row]["fits"] == 0 and results["budget"][row]["evaluations"] == 1
        assert results["weak_val_rows"][row]["nts"]["per_seed"] == results["rows"][row]["nts"]["per_seed"]
    assert results["rows"]["ens"]["nts"]["per_seed"][0] == pytest.approx(ens["test"]["transfer"]["nts"])


@pytest.mark.parametrize("ensemble, message", [
    ({"of": ["naive"], "by": "weights"}, "2 stages or more"),
    ({"of": ["naive", "naive"], "by": "weights"}, "distinct"),
    ({"of": ["later"], "by": "predictions"}, "earlier methods"),
    ({"of": ["naive", "a"], "by": "vote"}, "ensemble takes"),
])
def test_bad_ensemble_rows_are_refused(tmp_path, ensemble, message):
    with pytest.raises(ValueError, match=message):
        _protocol(tmp_path, [{"name": "naive"}, {"name": "a", "sweep": {"--model.anchor_coef": [1.0, 2.0]}},
                             {"name": "e", "ensemble": ensemble}, {"name": "later"}])


@pytest.mark.slow
def test_early_stopping_under_ddp_keeps_one_weak_val_checkpoint_and_every_rank_reads_both_rules(
        tmp_path, word_tokenizer_dir, cache_dir):
    import glob
    import subprocess
    import sys

    from tests.test_w2s_protocol import ROOT

    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]
    methods = [{"name": "es", "objective": "naive", "checkpoint": "best",
                "args": ["--trainer.val_check_interval=0.5", "--trainer.max_epochs=2"]}]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, extra_args=ddp, methods=methods)
    args = [sys.executable, os.path.join(ROOT, "tests", "ddp_protocol_script.py"), str(tmp_path),
            "--config", _write(tmp_path, cfg)]
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    proc = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = cfg["out_dir"]
    weak = [json.load(open(tmp_path / f"weak_val.rank{r}.json")) for r in (0, 1)]
    assert weak[0] == weak[1] and "es" in weak[0]
    es = _result(out, 0, "es")
    history = es["validations"]
    best = max(range(len(history)), key=lambda i: (history[i]["val_weak_acc"], -i))
    assert es["weak_val"]["step"] == history[best]["step"]
    assert weak[0]["es"]["nts"]["per_seed"]["0"] == pytest.approx(es["weak_val"]["test"]["transfer"]["nts"])
    assert os.path.isfile(es["weak_val"]["checkpoint"])  # kept (its twin, when id_val's is the same step, pruned)
    assert not glob.glob(os.path.join(out, "**", "*.tmp*"), recursive=True)
