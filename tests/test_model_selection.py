"""Model selection and paired comparisons (issue 23, protocols/w2s/model_selection.py): a swept method is one row whose
value per seed is the one with the best ID validation accuracy (`id_val`), the `oracle_target` table beside it picks
on the target test splits, a method that evaluates another's checkpoints costs no fit, and the paired differences are
the per-seed differences of the rows — all recomputed here from the stages' own result files."""
import json
import os
import statistics

import pytest

from protocols.w2s.model_selection import paired, select
from protocols.w2s.protocol import Method, main as run_protocol, parse
from tests.test_w2s_protocol import SRC, TARGETS, _tiny_protocol, _write


def _result(out, seed, stage):
    with open(os.path.join(out, f"seed{seed}", stage, "result.json")) as f:
        return json.load(f)


def test_a_swept_method_is_one_row_selected_on_id_validation(tmp_path, word_tokenizer_dir, cache_dir):
    methods = [{"name": "naive", "objective": "naive"},
               # WiSE-FT evaluates naive's checkpoint: at α = 1 exactly naive's scores
               {"name": "wise", "from_method": "naive", "sweep": {"--model.wise_ft_alpha": [0.5, 1.0]}},
               {"name": "anchor", "objective": "naive", "sweep": {"--model.anchor_coef": [1.0, 3.0]}},
               # evaluating a swept method: its id_val pick per seed (α = 1: that stage's own scores)
               {"name": "anchor_wise", "from_method": "anchor", "args": ["--model.wise_ft_alpha=1.0"]}]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, seeds=[0, 1], methods=methods,
                         paired_reference=["anchor", "naive"])
    results = run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]
    assert list(results["rows"]) == ["teacher", "naive", "wise", "anchor", "anchor_wise"]
    variants = {v: f"anchor@anchor_coef={v}" for v in (1.0, 3.0)}
    assert all(os.path.isdir(os.path.join(out, "seed0", name)) for name in variants.values())
    record = results["selection"]["swept"]["anchor"]
    for seed in (0, 1):
        stage = {v: _result(out, seed, name) for v, name in variants.items()}
        # id_val: the best validation accuracy (ties: the earlier value); the row is that stage's scores
        best = max(stage, key=lambda v: (stage[v]["val_acc"], -list(stage).index(v)))
        assert record["id_val"][seed] == best
        assert results["rows"]["anchor"]["nts"]["per_seed"][seed] == pytest.approx(stage[best]["test"]["transfer"]["nts"])
        # oracle_target: the best mean accuracy on the target test splits
        target_acc = {v: statistics.fmean(100 * s["test"][t]["acc"] for t in TARGETS) for v, s in stage.items()}
        oracle = max(stage, key=lambda v: (target_acc[v], -list(stage).index(v)))
        assert record["oracle_target"][seed] == oracle
        # the evaluating method: no fit, naive's checkpoint, at α = 1 naive's validation accuracy and test scores
        naive, again = _result(out, seed, "naive"), _result(out, seed, "wise@wise_ft_alpha=1.0")
        assert again["fit_seconds"] == 0.0 and again["checkpoint"] == naive["checkpoint"]
        assert again["val_acc"] == pytest.approx(naive["val_acc"], abs=1e-6)
        assert again["test"][SRC]["acc"] == pytest.approx(naive["test"][SRC]["acc"])
        composed = _result(out, seed, "anchor_wise")
        assert composed["evaluated"] == variants[best] and composed["checkpoint"] == stage[best]["checkpoint"]
        assert composed["val_acc"] == pytest.approx(stage[best]["val_acc"], abs=1e-6)
        assert composed["test"][SRC]["acc"] == pytest.approx(stage[best]["test"][SRC]["acc"])
    # paired: NTS(anchor) − NTS(X) per seed, from the rows
    rows = results["rows"]
    for method in ("naive", "wise"):
        d = results["paired"][method]
        for seed, diff in d["per_seed"].items():
            assert diff == pytest.approx(rows["anchor"]["nts"]["per_seed"][seed] - rows[method]["nts"]["per_seed"][seed])
        assert d["mean"] == pytest.approx(statistics.fmean(d["per_seed"].values()))
    # a second reference: its own table, the first one's differences with the sign turned
    assert results["paired_reference"] == "anchor" and results["paired_by_reference"]["anchor"] == results["paired"]
    for seed, diff in results["paired_by_reference"]["naive"]["anchor"]["per_seed"].items():
        assert diff == pytest.approx(-results["paired"]["naive"]["per_seed"][seed])
    md = open(os.path.join(out, "results.md")).read()
    assert "Model selection `id_val`" in md and "Oracle selection" in md
    assert "NTS(anchor) − NTS(X)" in md and "NTS(naive) − NTS(X)" in md
    assert "- anchor (--model.anchor_coef ∈ {1, 3}): seed 0:" in md
    # the cost table: a fit's seconds against naive's; the evaluating method fits nothing; the sweep's stages
    from benchmarks.baseline_costs import cost_table

    costs = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in cost_table(out).splitlines()[2:]}
    assert costs["naive"][2] == "1.00×" and costs["wise"][1] == "– (no fit)" and costs["anchor"][3] == "2"


def test_paired_differences_by_hand():
    cell = lambda *v: {"per_seed": {str(i): x for i, x in enumerate(v)}}  # noqa: E731
    table = {"teacher": {"nts": cell(0, 0, 0)}, "anchor": {"nts": cell(5.0, 1.0, 3.0)},
             "naive": {"nts": cell(1.0, 2.0, -1.0)}, "short": {"nts": {"per_seed": {"1": 0.5}}}}
    d = paired(table, "anchor")
    assert d["naive"]["per_seed"] == {"0": 4.0, "1": -1.0, "2": 4.0} and d["naive"]["mean"] == pytest.approx(7 / 3)
    # std 2.8868, t(2) = 4.303: half width 4.303 * 2.8868 / sqrt(3) = 7.172
    low, high = d["naive"]["ci95"]
    assert (low, high) == (pytest.approx(7 / 3 - 7.172, abs=1e-3), pytest.approx(7 / 3 + 7.172, abs=1e-3))
    assert d["short"] == {"per_seed": {"1": 0.5}, "mean": 0.5, "std": None, "n": 1, "ci95": None}
    assert "teacher" not in d and paired(table, "missing") == {}


def test_selection_ties_go_to_the_earlier_value_and_missing_validation_is_refused(tmp_path):
    p = parse(["--config", _write(tmp_path, {
        "out_dir": str(tmp_path / "run"), "trainer_configs": [], "data_configs": [], "student_configs": [],
        "teacher_configs": [__file__], "methods": [{"name": "m", "sweep": {"--model.anchor_coef": [1.0, 2.0]}}]})])
    res = lambda v: {"val_acc": v, "test": {"t": {"acc": 0.5}}}  # noqa: E731
    raw = {"teacher": {0: {}}, "m@anchor_coef=1.0": {0: res(80.0)}, "m@anchor_coef=2.0": {0: res(80.0)}}
    rows, picked = select(p, raw, "id_val", ["t"])
    assert picked == {"m": {0: 1.0}} and list(rows) == ["teacher", "m"]
    raw["m@anchor_coef=2.0"][0]["val_acc"] = None
    with pytest.raises(ValueError, match="no val_acc.*--force"):
        select(p, raw, "id_val", ["t"])


@pytest.mark.parametrize("method, message", [
    ({"name": "m", "sweep": {"--model.a": [1], "--model.b": [2]}}, "sweep takes one flag"),
    ({"name": "m", "sweep": {"anchor_coef": [1]}}, "not a cli.py flag"),
    ({"name": "m", "sweep": {"--model.anchor_coef": []}}, "non-empty list"),
    ({"name": "m", "sweep": {"--model.anchor_coef": [1, 1]}}, "repeats a value"),
    ({"name": "m", "checkpoint": "first"}, "'best' or 'last'"),
])
def test_bad_sweeps_are_refused(method, message):
    with pytest.raises(ValueError, match=message):
        Method(**method)


@pytest.mark.parametrize("methods", [
    [{"name": "wise", "from_method": "naive"}, {"name": "naive"}],  # later
    [{"name": "naive"}, {"name": "a", "from_method": "naive"}, {"name": "wise", "from_method": "a"}],  # evaluates
    [{"name": "naive"}, {"name": "wise", "from_method": "naive", "anchor_coef": 1.0}],  # its own model options
])
def test_from_method_must_name_an_earlier_fitted_method(tmp_path, word_tokenizer_dir, cache_dir, methods):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, methods=methods)
    source = next(m["from_method"] for m in methods if m["name"] == "wise")
    message = f"from_method '{source}' must name an earlier method|evaluates 'naive'.*drop its own \\['anchor_coef'\\]"
    with pytest.raises(ValueError, match=message):
        run_protocol(["--config", _write(tmp_path, cfg)])


@pytest.mark.slow  # a whole protocol run (15-25 s): make test-slow; the fast suite keeps its parts' unit tests
def test_an_early_stopped_stage_reports_the_drift_of_the_checkpoint_it_keeps(tmp_path, word_tokenizer_dir, cache_dir):
    """Drift belongs to the scored weights: a `best` checkpoint's row reads the measurement taken at its step, not
    the final weights' (which a `last` stage of the same run reports)."""
    from protocols.w2s.protocol import checkpoint_step

    methods = [{"name": "naive", "objective": "naive"},
               {"name": "early", "objective": "naive", "checkpoint": "best",
                "args": ["--trainer.val_check_interval=0.25", "--trainer.max_epochs=2"]}]
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir, methods=methods, drift=True)
    run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]
    result = _result(out, 0, "early")
    with open(os.path.join(out, "seed0", "early", "fit", "drift.json")) as f:
        drift_file = json.load(f)
    history, id_split = drift_file["history"], drift_file["id_split"]
    step = checkpoint_step(result["checkpoint"])
    kept = next(h["drift"] for h in history if h["step"] == step)
    targets = [s for s in kept if s != id_split]
    for layer, value in result["drift"]["ood_mean"]["mse"].items():
        assert value == pytest.approx(statistics.fmean(kept[t]["mse"][layer] for t in targets))
    assert result["drift"]["id"] == kept[id_split]
    # this run's best checkpoint is not its last weights (else the test shows nothing), and the final drift differs
    assert step < history[-1]["step"] and history[-1]["drift"] != kept
