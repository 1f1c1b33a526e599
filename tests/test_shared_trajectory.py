"""One fit per trajectory (issue 51 item 5, `Method.trajectory`): a row that differs from another only in the checkpoint
it keeps reads that fit's final weights instead of fitting again.

Proved first: the early-stopping fit (four validations an epoch, the best checkpoint kept) ends in the very weights,
bit for bit, of the fit that validates once an epoch, over two epochs (where a validation's draw from the random
state could reach the second epoch's shuffle). Then, on tiny models: the reading rows equal the rows of separately
fitted twins cell for cell (a swept pair too, value by value, with the same pick), with one fit fewer per read stage;
adding a reader to a finished run costs its evaluations only; bad configurations are refused naming the method."""
import json
import os

import pytest
import torch

from protocols.w2s.protocol import main as run_protocol, parse
from tests.test_w2s_protocol import _tiny_protocol, _write

EARLY = ["--trainer.val_check_interval=0.25"]  # 5 batches an epoch: a validation after every step
SWEEP = {"--model.anchor_coef": [1.0, 10.0]}


def _weights(path: str) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def _result(out: str, stage: str) -> dict:
    with open(os.path.join(out, "seed0", stage, "result.json")) as f:
        return json.load(f)


def _fits(out: str, stage: str) -> int:
    """`cli.py fit` commands a stage ran (its commands.sh)."""
    with open(os.path.join(out, "seed0", stage, "commands.sh")) as f:
        return sum(line.startswith("python cli.py fit ") for line in f)


def _config(tmp_path, tokenizer, cache, methods, name="protocol.yaml") -> str:
    cfg = _tiny_protocol(tmp_path, tokenizer, cache, extra_args=["--trainer.max_epochs=2"], ceiling=True,
                         drift=True, methods=methods)
    return _write(tmp_path, cfg, name)


CACHE = ["--reference.cache_outputs=true"]  # as the shipped ANCHOR pairs: the reference's outputs kept across stages
BASE = [{"name": "naive"},
        {"name": "anchor", "args": CACHE, "sweep": SWEEP},
        {"name": "early_stop", "checkpoint": "best", "args": EARLY},
        {"name": "anchor_early_stop", "checkpoint": "best", "args": CACHE + EARLY, "sweep": SWEEP}]
READERS = [{"name": "naive_read", "trajectory": "early_stop", "checkpoint": "last"},
           {"name": "anchor_read", "trajectory": "anchor_early_stop", "checkpoint": "last"}]


def test_reading_rows_equal_their_separately_fitted_twins_with_one_fit_fewer(tmp_path, word_tokenizer_dir, cache_dir):
    config = _config(tmp_path, word_tokenizer_dir, cache_dir, BASE)
    out = parse(["--config", config]).out_dir
    run_protocol(["--config", config])
    # The proof: validating after every step instead of once an epoch leaves the final weights bit for bit.
    for fitted, early in [("naive", "early_stop"), *[(f"anchor@anchor_coef={v}", f"anchor_early_stop@anchor_coef={v}")
                                                    for v in ("1.0", "10.0")]]:
        own, last = _result(out, fitted), _result(out, early)["last"]
        assert last["drew"] == [] and last["step"] == 10 and _result(out, early)["step"] < 10  # it stopped earlier
        a, b = _weights(own["checkpoint"]), _weights(last["checkpoint"])
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (fitted, early)
    # The readers, added to the finished run: evaluations only, nothing else runs again.
    runs = {s: _result(out, s)["run"] for s in os.listdir(os.path.join(out, "seed0"))}
    config = _config(tmp_path, word_tokenizer_dir, cache_dir, BASE + READERS, "readers.yaml")
    results = run_protocol(["--config", config])
    assert {s: _result(out, s)["run"] for s in runs} == runs
    readers = ["naive_read", "anchor_read@anchor_coef=1.0", "anchor_read@anchor_coef=10.0"]
    assert [_fits(out, s) for s in readers] == [0, 0, 0]
    assert [_fits(out, s) for s in ("naive", "early_stop")] == [1, 1]
    rows = results["rows"]
    assert list(rows) == ["teacher", "ceiling", "naive", "anchor", "early_stop", "anchor_early_stop", "naive_read",
                          "anchor_read"]
    for own, read in [("naive", "naive_read"), ("anchor", "anchor_read")]:
        assert rows[read].keys() == rows[own].keys()
        assert {k: c["per_seed"] for k, c in rows[read].items()} == {k: c["per_seed"] for k, c in rows[own].items()}
        assert results["weak_val_rows"][read] == results["weak_val_rows"][own]
    swept = results["selection"]["swept"]
    assert swept["anchor_read"]["id_val"] == swept["anchor"]["id_val"]
    assert swept["anchor_read"]["scores"] == swept["anchor"]["scores"]
    budget = results["budget"]
    assert (budget["naive_read"]["fits"], budget["naive_read"]["evaluations"]) == (0, 1)
    assert (budget["anchor_read"]["fits"], budget["anchor_read"]["evaluations"]) == (0, 2)
    assert (budget["early_stop"]["fits"], budget["anchor_early_stop"]["fits"]) == (1, 2)
    assert "| naive_read (the final weights of early_stop's fits) | 0 | 1 | 1 |" in results["markdown"]
    reader = _result(out, "anchor_read@anchor_coef=10.0")
    assert reader["evaluated"] == "anchor_early_stop@anchor_coef=10.0"
    assert reader["identity"]["trajectory"] == "anchor_early_stop@anchor_coef=10.0"
    assert reader["checkpoint"] == _result(out, "anchor_early_stop@anchor_coef=10.0")["last"]["checkpoint"]


def test_a_reader_plans_no_fit_and_its_source_runs_first(tmp_path, word_tokenizer_dir, cache_dir):
    from protocols.w2s.stages import plan_stages

    methods = [{"name": "naive", "trajectory": "early_stop", "checkpoint": "last"},
               {"name": "wise_ft", "from_method": "naive", "sweep": {"--model.wise_ft_alpha": [0.5]}},
               {"name": "early_stop", "checkpoint": "best", "args": EARLY}]
    stages = plan_stages(parse(["--config", _config(tmp_path, word_tokenizer_dir, cache_dir, methods)]))
    assert [s.name for s in stages] == ["teacher", "ceiling", "early_stop", "naive", "wise_ft@wise_ft_alpha=0.5"]
    naive = stages[3]
    assert (naive.reads, naive.evaluates, naive.args, naive.checkpoint) == ("early_stop", "early_stop",
                                                                           stages[2].args, "last")
    assert naive.upstream == ("teacher", "ceiling", "early_stop") and stages[2].keep_last


@pytest.mark.parametrize("methods, message", [
    ([{"name": "naive", "trajectory": "early"}], "method 'naive': trajectory 'early' must name a method that fits"),
    ([{"name": "early_stop", "checkpoint": "best", "args": EARLY},
      {"name": "a", "trajectory": "early_stop", "checkpoint": "last"},
      {"name": "b", "trajectory": "a", "checkpoint": "last"}],
     "method 'b': trajectory 'a' must name a method that fits"),
    ([{"name": "early_stop", "checkpoint": "best", "args": EARLY},
      {"name": "naive", "trajectory": "early_stop", "args": ["--trainer.max_epochs=3"]}],
     r"method 'naive' reads 'early_stop'.s fit \(trajectory\), whose options make it: drop its own \['args'\]"),
    ([{"name": "early_stop", "checkpoint": "best", "args": EARLY},
      {"name": "naive", "trajectory": "early_stop", "anchor_coef": 1.0}], r"drop its own \['anchor_coef'\]"),
    ([{"name": "early_stop", "args": EARLY}, {"name": "naive", "trajectory": "early_stop"}],
     "method 'naive' keeps the last checkpoint of 'early_stop'.s fit, which must keep its best"),
    ([{"name": "anchor_es", "checkpoint": "best", "args": EARLY, "sweep": SWEEP},
      {"name": "anchor", "trajectory": "anchor_es", "sweep": {"--model.anchor_coef": [1.0]}}],
     "method 'anchor': its sweep .* must be 'anchor_es'.s"),
])
def test_a_bad_reader_is_refused_naming_it(tmp_path, word_tokenizer_dir, cache_dir, methods, message):
    with pytest.raises(ValueError, match=message):
        parse(["--config", _config(tmp_path, word_tokenizer_dir, cache_dir, methods)])


def test_the_guard_records_a_training_step_that_draws_and_a_reader_refuses_that_fit():
    from types import SimpleNamespace

    from callbacks.trajectory_guard import TrajectoryGuard
    from protocols.w2s.stages import Stage, read_checkpoint

    guard, trainer = TrajectoryGuard(), SimpleNamespace(global_step=3)
    guard.on_train_batch_start(trainer, None, None, 0)
    guard.on_train_batch_end(trainer, None, None, None, 0)  # a step that draws nothing
    assert guard.drew == []
    guard.on_train_batch_start(trainer, None, None, 1)
    torch.rand(1)  # dropout's draw
    guard.on_train_batch_end(trainer, None, None, None, 1)
    assert guard.drew == ["training step 3 (torch random state: dropout, noise or sampling in the step)"]
    reader = Stage(0, "naive", "method 'naive'", "/run/seed0/naive", [], "last", reads="early_stop")
    with pytest.raises(ValueError, match=r"reads the fit of /run/seed0/early_stop, whose trajectory depends on how "
                                         r"often it validates \(training step 3 "):
        read_checkpoint(reader, {"checkpoint": "best.ckpt", "last": {"checkpoint": "final.ckpt", "drew": guard.drew}})
    with pytest.raises(ValueError, match=r"finished before early-stopping fits kept them: rerun it with --force "
                                         r"seed0/early_stop"):
        read_checkpoint(reader, {"checkpoint": "best.ckpt"})
    assert read_checkpoint(reader, {"checkpoint": "best.ckpt", "last": {"checkpoint": "final.ckpt", "drew": []}}) \
        == "final.ckpt"
