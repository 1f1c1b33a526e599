"""Issue 49, items 3-7, on inputs that need no finished protocol run: validation before any folder is made (seeds,
`--force` names, zero-step fits, `methods: []`), the mixture's report as a published set that a rerun of any of its
stages withdraws (also from another experiment of the family), `--status` marking the table stale when a stage it
reads changed or its configuration no longer parses, a damaged tokenized cache named and rebuilt, and a full disk at
publish named in one line with the old set kept. Linked W2S folders: tests/test_published_sets.py."""
import errno
import glob
import json
import os
import warnings

import pytest

from protocols.mixture import protocol as mixture, stages as mixture_stages
from protocols.engine import local, status as engine_status
from protocols.engine.published_set import set_state
from protocols.engine.stage_identity import ForceSpec
from protocols.w2s.protocol import main as run_protocol
from tests.test_mixture_protocol import _fake_run
from tests.test_w2s_protocol import _tiny_protocol, _write


def _refused(tmp_path, cfg, message, extra=()):
    with pytest.raises(ValueError, match=message):
        run_protocol(["--config", _write(tmp_path, cfg), *extra])
    assert not os.path.exists(os.path.join(cfg["out_dir"], "seed0")), "refused only after some work"
    assert not glob.glob(os.path.join(cfg["out_dir"], "seed-*")), "a folder of a negative seed"


# ---- item 4 / finding 6-7: validation before any folder -------------------------------------------------------
@pytest.mark.parametrize("overrides, extra, message", [
    ({"seeds": [-1]}, (), r"--seeds \[-1\]: \[-1\] is not a non-negative integer"),
    ({"seeds": [0]}, ("--force", "seed5/naive"), r"--force seed5/naive: seed\(s\) \[5\] are not among this run's "
                                                 r"seeds \[0\]"),
    ({"methods": []}, (), r"--methods is empty: give at least one student method"),
])
def test_bad_seeds_force_names_and_no_methods_are_refused_before_any_folder(tmp_path, word_tokenizer_dir, overrides,
                                                                             extra, message):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"), **overrides)
    _refused(tmp_path, cfg, message, extra)


def test_force_names_are_checked_against_the_seeds():
    ForceSpec(["seed0/naive", "teacher"]).check({"teacher", "naive"}, seeds=[0, 1])
    with pytest.raises(ValueError, match=r"--force seed_5/sft: seed\(s\) \[5\] are not among this run's seeds \[0\]"):
        ForceSpec(["seed_5/sft", "sft"]).check({"sft"}, seeds=[0])


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "-3"], r"--seeds \[-3\]: \[-3\] is not a non-negative integer"),
    (["--seeds", "0", "--force", "seed_5/sft"], r"--force seed_5/sft: seed\(s\) \[5\] are not among"),
])
def test_the_mixture_refuses_a_negative_seed_and_a_force_of_another_seed_before_any_folder(tmp_path, capsys, argv,
                                                                                        message):
    with pytest.raises(SystemExit):
        mixture.main(["two_policies", "--out", str(tmp_path / "mix"), *argv])
    import re

    assert re.search(message, capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "mix")


# ---- item 3 / finding 5: nothing untrained is published -------------------------------------------------------
@pytest.mark.parametrize("where, flag, message", [
    ("student_args", "--trainer.max_epochs=0", r"seed0/naive .*--trainer.max_epochs=0 \(in student_args"),
    ("teacher_args", "--trainer.limit_train_batches=0", r"seed0/teacher .*--trainer.limit_train_batches=0 \(in "
                                                        r"teacher_args\): the fit would make no optimizer step"),
])
def test_a_fit_of_no_optimizer_step_is_refused_before_any_work(tmp_path, word_tokenizer_dir, where, flag, message):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"))
    cfg[where] = cfg[where] + [flag]
    _refused(tmp_path, cfg, message)


def test_a_fit_that_made_no_step_after_all_is_refused_before_its_result_is_written(tmp_path):
    """What the configuration cannot show (an empty training split, max_time spent before the first step)."""
    from protocols.w2s.fit import UntrainedStageError, refuse_untrained
    from protocols.w2s.stages import Stage

    class Trainer:
        global_step = 0

    teacher = Stage(0, "teacher", "weak teacher", str(tmp_path / "seed0" / "teacher"), [], "best")
    with pytest.raises(UntrainedStageError, match=r"seed0/teacher \(weak teacher\): its fit made no optimizer step "
                                                  r"\(global step 0\).*in teacher_args"):
        refuse_untrained(Trainer(), teacher)
    Trainer.global_step = 3
    refuse_untrained(Trainer(), teacher)


# ---- item 2 / finding 4: the mixture's report is a published set ------------------------------------------------
def _mixture_run(tmp_path, experiment, force=None, report=None):
    """What `python -m protocols.mixture EXPERIMENT --seeds 0` does, on the engine, with each stage's `cli.py fit`
    replaced by a record (`_fake_run`); returns the report's set folder."""
    exp = mixture.EXPERIMENTS[experiment]
    stages = mixture._selected(exp, ["two_policies_rl_A"])
    hooks = mixture_stages.MixtureHooks(experiment, exp, stages, [0], str(tmp_path), {"sft": [], "rl": []}, 1, None,
                                        report or f"{experiment}_seeds_0", f"python -m protocols.mixture {experiment}")
    specs = hooks.specs()
    local.refuse_changed(specs, hooks, ForceSpec(force))
    hooks.publish(specs, local.run_local(specs, hooks, ForceSpec(force)))
    return hooks, os.path.join(hooks.root, f"{hooks.report}_results")


def _recorded_run(calls):
    """`_fake_run`, with what the report reads of an SFT stage."""
    fake = _fake_run(calls)

    def run(stage, args, identity, ckpt, seed_dir, env, record_path, seed):
        record = fake(stage, args, identity, ckpt, seed_dir, env, record_path, seed)
        if stage.sft:
            record["sft"] = {"steps": 3, "fidelity_mean": 0.99, "fidelity_min": 0.9, "capability": 0.95}
            mixture_stages._write_json(record_path, record)
        return record
    return run


def test_a_mixture_report_is_withdrawn_when_another_experiment_reruns_a_stage_it_read(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(mixture_stages, "_run", _recorded_run(calls))
    hooks, two = _mixture_run(tmp_path, "two_policies")
    record = json.load(open(os.path.join(two, "set.json")))
    assert sorted(record["stages"]) == ["seed_0/sft", "seed_0/two_policies_rl_A"]
    assert record["stages"]["seed_0/sft"]["real"] == os.path.realpath(hooks.record(hooks.specs()[0]))
    assert set_state(two) == ("published", "") and os.path.islink(two + ".md")
    specs = hooks.specs()
    rows = {r["stage"]: r["state"] for r in engine_status.stage_rows(specs, hooks)}
    assert rows["collect"] == "done"

    # another experiment of the family reruns the SFT the first report read (another recipe, --force sft)
    _mixture_run(tmp_path, "two_policies_algorithms", force=["sft"])
    assert calls == ["sft", "two_policies_rl_A", "sft", "two_policies_rl_A"]
    assert not os.path.exists(two) and not os.path.lexists(two + ".md")
    note = open(two + ".stale/STALE.md", encoding="utf-8").readline()
    assert "seed_0/sft" in note and "runs again" in note
    state, detail = set_state(two)
    assert state == "stale" and "seed_0/sft" in detail
    rows = {r["stage"]: r["state"] for r in engine_status.stage_rows(specs, hooks)}
    assert rows["collect"].startswith("stale (withdrawn on ") and "seed_0/sft" in rows["collect"]

    # a stage rerun behind its back (its record's run changed): the report's readers and --status call it stale
    _mixture_run(tmp_path, "two_policies")
    assert set_state(two) == ("published", "") and not os.path.exists(two + ".stale")
    path = hooks.record(specs[1])
    json.dump(dict(json.load(open(path)), run="another-run"), open(path, "w"))
    rows = {r["stage"]: r["state"] for r in engine_status.stage_rows(specs, hooks)}
    assert rows["collect"] == "stale (seed_0/two_policies_rl_A ran again since the table was published)"


# ---- item 7 / finding 10: --status never calls a table "done" over changed stages ------------------------------
def test_status_marks_the_table_stale_when_a_stage_changed_or_no_longer_parses(tmp_path):
    from protocols.engine.status import stage_rows
    from tests.test_engine import FakeHooks

    hooks = FakeHooks(tmp_path, {"a": 1, "b": 2})
    specs = [local_spec("a"), local_spec("b")]
    local.run_local(specs, hooks, ForceSpec(None))
    open(os.path.join(str(tmp_path), "table.json"), "w").write("{}")  # the published table
    assert [r["state"] for r in stage_rows(specs, hooks)] == ["done", "done", "done"]
    rows = stage_rows(specs, hooks, changed=lambda spec, result: ["config: 1 → 3"] if spec.name == "a" else [])
    assert rows[0]["state"].startswith("changed (a rerun refuses it: config: 1 → 3")
    assert rows[-1]["state"] == "stale (seed0/a changed since)"

    def unparsable(spec, result):
        raise ValueError("config file 'model.yaml' does not exist\nmore")
    rows = stage_rows(specs, hooks, changed=unparsable)
    assert rows[0]["state"] == ("changed (a rerun refuses it: its configuration no longer parses: config file "
                                "'model.yaml' does not exist; --force seed0/a reruns it)")
    assert rows[-1]["state"] == "stale (seed0/a, seed0/b changed since)"


def local_spec(name):
    from protocols.engine.spec import StageSpec

    return StageSpec(f"seed0/{name}", 0, name)


# ---- item 5 / finding 8: a damaged tokenized cache; a full disk at publish --------------------------------------
def test_a_truncated_tokenized_cache_is_named_removed_and_rebuilt(tmp_path, word_tokenizer_dir):
    from tests.helpers import tiny_data

    cache = str(tmp_path / "cache")
    first = tiny_data(word_tokenizer_dir, cache)
    first.prepare_data()
    first.setup("fit")
    expected = [list(first.datasets["train_teacher"].cols[k]) for k in ("id", "a_input_ids")]
    arrows = sorted(glob.glob(os.path.join(cache, "tokenized", "train_teacher-*", "*.arrow")))
    assert arrows
    data = open(arrows[0], "rb").read()
    open(arrows[0], "wb").write(data[: len(data) // 3])  # a copy cut short: "Expected to read ... bytes"

    second = tiny_data(word_tokenizer_dir, cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second.prepare_data()
        second.setup("fit")
    folder = os.path.dirname(arrows[0])
    named = [str(w.message) for w in caught if "tokenized cache" in str(w.message)]
    assert named and named[0].startswith(f"the tokenized cache {folder} could not be read (") and \
        named[0].endswith("): removed; it is rebuilt now"), named
    assert [list(second.datasets["train_teacher"].cols[k]) for k in ("id", "a_input_ids")] == expected
    assert os.path.getsize(arrows[0]) == len(data)  # rebuilt whole
    third = tiny_data(word_tokenizer_dir, cache)  # and read as it is from now on, without a word
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        third.prepare_data()
        third.setup("fit")
    assert not [w for w in caught if "tokenized cache" in str(w.message)]


def test_a_damaged_cache_that_cannot_be_removed_is_refused_with_its_path_and_the_command(tmp_path, monkeypatch):
    import datasets

    from datamodules.preference import tokenized_cache
    from datamodules.preference.sources import DataError

    path = str(tmp_path / "tokenized" / "train_teacher-abc-def")
    datasets.Dataset.from_dict({"a": list(range(50))}).save_to_disk(path)
    arrow = glob.glob(os.path.join(path, "*.arrow"))[0]
    open(arrow, "wb").write(open(arrow, "rb").read()[:64])

    def refuse(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", src)
    monkeypatch.setattr(tokenized_cache.os, "rename", refuse)
    with pytest.raises(DataError, match=rf"the tokenized cache {path} cannot be read \(.*\) nor removed .*clear it "
                                        rf"with: rm -rf '{path}'"):
        tokenized_cache.load_cached_split(path)


def test_a_full_disk_at_publish_names_the_set_in_one_line_and_keeps_the_old_set(tmp_path, monkeypatch, capfd):
    """The tables are written, then TensorBoard's event writer thread meets the full disk: no thread traceback, one
    error naming the set and the file, the old set whole, no half-written set left."""
    from tensorboard.summary.writer import record_writer
    from torch.utils.tensorboard import SummaryWriter

    from protocols.engine.run_files import PublishError, publish_set

    parent = str(tmp_path)
    publish_set(parent, "results", lambda folder: open(os.path.join(folder, "results.md"), "w").write("old"),
                {"results.md": "results/results.md"})

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(record_writer.RecordWriter, "write", full)

    def write(folder):
        open(os.path.join(folder, "results.md"), "w").write("new")
        writer = SummaryWriter(os.path.join(folder, "summary"))
        writer.add_scalar("acc", 1.0, 0)
        writer.close()
    capfd.readouterr()
    with pytest.raises(PublishError) as err:
        publish_set(parent, "results", write, {"results.md": "results/results.md"})
    message = str(err.value)
    assert message.startswith(f"cannot publish {parent}/results: no space left on the device") and \
        "the set published before is kept as it was" in message and "\n" not in message, message
    assert err.value.errno == errno.ENOSPC
    assert "Traceback" not in capfd.readouterr().err
    assert open(os.path.join(parent, "results.md")).read() == "old"
    assert sorted(os.listdir(parent)) == ["results", "results.md"]

    def plain(folder):  # a write of ours that names no file: the set and the reason still do
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(PublishError, match=rf"^cannot publish {parent}/results: no space left on the device; the set "
                                           r"published before is kept as it was and the half-written one removed; "
                                           r"free space there and rerun"):
        publish_set(parent, "results", plain)
