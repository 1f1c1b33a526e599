"""Issue 34: a published table is never another configuration's, never stale, never mislabelled; a refusal comes
before any work and reads as one line.

One tiny protocol run (teacher + naive, 1 seed, about 20 s) is shared by the tests that need finished stages; each
copies it so that no test sees another's changes.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from protocols.engine.published_set import PublishedSetError, load_published, set_state
from protocols.w2s.regime_table import main as regime_table
from protocols.w2s.protocol import main as run_protocol
from tests.test_w2s_protocol import ROOT, _tiny_protocol, _write


@pytest.fixture(scope="module")
def finished(tmp_path_factory, word_tokenizer_dir):
    """A finished tiny run: (folder holding run/ and cache/, its config dict)."""
    base = tmp_path_factory.mktemp("finished")
    cfg = _tiny_protocol(base, word_tokenizer_dir, str(base / "cache"))
    run_protocol(["--config", _write(base, cfg)])
    return base, cfg


def _copy(finished, tmp_path) -> dict:
    """The finished run and its cache under tmp_path, with the config's paths moved there."""
    base, cfg = finished
    shutil.copytree(base / "run", tmp_path / "run", symlinks=True)
    shutil.copytree(base / "cache", tmp_path / "cache")
    for root, _, files in os.walk(tmp_path / "run"):  # the stages' records name their checkpoints by path
        for name in files:
            if name.endswith(".json") or name.endswith(".read_by"):  # and the sets that read them
                path = os.path.join(root, name)
                text = open(path, encoding="utf-8").read()
                open(path, "w", encoding="utf-8").write(text.replace(str(base), str(tmp_path)))
    return json.loads(json.dumps(cfg).replace(str(base), str(tmp_path)))


def _table(out) -> str:
    return open(os.path.join(out, "results.md"), encoding="utf-8").read()


# ---- 2: a set belongs to one configuration -----------------------------------------------------------------------
def test_another_configuration_is_refused_before_any_work_then_gets_its_own_set(finished, tmp_path):
    cfg = _copy(finished, tmp_path)
    out = cfg["out_dir"]
    before = _table(out)
    other = dict(cfg, methods=[{"name": "naive2", "objective": "naive"}])  # would drop naive's row
    with pytest.raises(PublishedSetError, match=r"another protocol configuration.*methods: drops \['naive'\].*"
                                                r"--results_name NAME.*--replace_results"):
        run_protocol(["--config", _write(tmp_path, other, "other.yaml")])
    assert not os.path.exists(os.path.join(out, "seed0", "naive2"))  # refused before any stage ran
    assert _table(out) == before

    # its own name: a second set beside the first, which stays as it was
    run_protocol(["--config", _write(tmp_path, dict(other, results_name="results_other"), "other.yaml")])
    assert _table(out) == before
    theirs = open(os.path.join(out, "results_other.md"), encoding="utf-8").read()
    assert "| naive2 |" in theirs and "| naive2 |" not in before
    assert load_published(os.path.join(out, "results_other"))["rows"].keys() == {"teacher", "naive2"}

    # --replace_results: the old set is withdrawn, then the new one published under the default name
    run_protocol(["--config", _write(tmp_path, other, "other.yaml"), "--replace_results"])
    assert "| naive2 |" in _table(out) and "| naive |" not in _table(out)
    assert not os.path.exists(os.path.join(out, "results.stale"))  # the fresh publish removes the withdrawn copy


def test_a_grown_configuration_or_an_option_added_at_its_default_is_the_same_owner(finished, tmp_path):
    """An option the code added since the set was published (here results_name, absent from an older
    protocol.json) is no change of the owner, nor is a configuration that only adds methods or seeds: the rerun
    republishes in place, and the new table holds every old row."""
    cfg = _copy(finished, tmp_path)
    protocol = os.path.join(cfg["out_dir"], "results", "protocol.json")
    old = json.load(open(protocol))
    old.pop("results_name")
    os.chmod(protocol, 0o644)
    json.dump(old, open(protocol, "w"))
    run_protocol(["--config", _write(tmp_path, cfg)])
    assert json.load(open(protocol))["results_name"] == "results"
    grown = dict(cfg, methods=cfg["methods"] + [{"name": "naive2", "objective": "naive"}])
    run_protocol(["--config", _write(tmp_path, grown)])
    assert "| naive |" in _table(cfg["out_dir"]) and "| naive2 |" in _table(cfg["out_dir"])


# ---- 3: a set whose stages changed or vanished -----------------------------------------------------------------
def test_a_failed_forced_rerun_withdraws_the_set_at_once(finished, tmp_path):
    """The issue's case: `--force naive` on a corrupt teacher checkpoint fails after clearing naive; the old table
    must no longer read as the result (today it stays, and regime_table prints the old naive row)."""
    cfg = _copy(finished, tmp_path)
    out = cfg["out_dir"]
    teacher = json.load(open(os.path.join(out, "seed0", "teacher", "result.json")))["checkpoint"]
    assert teacher.startswith(str(tmp_path))
    data = open(teacher, "rb").read()
    open(teacher, "wb").write(data[: len(data) // 2])  # truncated: the student's weak labels cannot be made
    with pytest.raises(Exception):
        run_protocol(["--config", _write(tmp_path, cfg), "--force", "naive"])
    assert not os.path.exists(os.path.join(out, "seed0", "naive", "result.json"))
    assert not os.path.lexists(os.path.join(out, "results.md")) and not os.path.exists(os.path.join(out, "results"))
    note = open(os.path.join(out, "results.stale", "STALE.md"), encoding="utf-8").readline()
    assert "seed0/naive runs again" in note
    assert set_state(os.path.join(out, "results"))[0] == "stale"
    with pytest.raises(PublishedSetError, match="withdrawn.*seed0/naive runs again"):
        regime_table(["--run", f"helpful={out}"])


def test_a_set_whose_stage_is_gone_or_ran_again_is_refused_by_its_readers(finished, tmp_path):
    cfg = _copy(finished, tmp_path)
    out = cfg["out_dir"]
    assert set(load_published(out)["rows"]) == {"teacher", "naive"}
    result = os.path.join(out, "seed0", "naive", "result.json")
    record = json.load(open(result))
    json.dump(dict(record, run="another-run"), open(result, "w"))
    with pytest.raises(PublishedSetError, match="stale: seed0/naive ran again since the table was published"):
        load_published(out)
    assert set_state(os.path.join(out, "results")) == ("stale", "seed0/naive ran again since the table was published")
    os.remove(result)
    with pytest.raises(PublishedSetError, match=r"seed0/naive is gone \(no seed0/naive/result.json\)"):
        regime_table(["--run", f"helpful={out}"])


def test_a_rerun_through_a_linked_seed_folder_withdraws_the_other_configurations_set(finished, tmp_path,
                                                                                     monkeypatch):
    """Issue 49, finding 3: configuration B links A's seed folders (docs/reruns.md) and reruns the teacher with
    another recipe; A's set read that teacher, so it is withdrawn at once, wherever it lives, and A's `--status`
    and readers say so. (B's stage is stopped right after the withdrawal: what it would train is not the point.)"""
    from protocols.w2s import protocol as w2s

    cfg = _copy(finished, tmp_path)
    a_out, b_out = cfg["out_dir"], str(tmp_path / "run_b")
    record = json.load(open(os.path.join(a_out, "results", "set.json")))
    teacher = os.path.realpath(os.path.join(a_out, "seed0", "teacher", "result.json"))
    assert record["stages"]["seed0/teacher"]["real"] == teacher
    os.makedirs(os.path.join(b_out, ".stages"))
    os.symlink(os.path.join(a_out, "seed0"), os.path.join(b_out, "seed0"))
    os.symlink(os.path.join(a_out, ".stages", "seed0"), os.path.join(b_out, ".stages", "seed0"))
    other = dict(cfg, out_dir=b_out, teacher_args=cfg["teacher_args"] + ["--trainer.max_epochs=2"])

    def stopped(self, spec, upstream, identity, forced):
        raise RuntimeError(f"stopped before {spec.key} ran")
    monkeypatch.setattr(w2s.W2SHooks, "run", stopped)
    with pytest.raises(RuntimeError, match="stopped before seed0/teacher ran"):
        run_protocol(["--config", _write(tmp_path, other, "b.yaml"), "--force", "teacher"])
    assert not os.path.exists(os.path.join(a_out, "results")) and not os.path.lexists(os.path.join(a_out, "results.md"))
    note = open(os.path.join(a_out, "results.stale", "STALE.md"), encoding="utf-8").readline()
    assert f"seed0/teacher ({os.path.dirname(teacher)}) runs again" in note
    with pytest.raises(PublishedSetError, match="withdrawn.*seed0/teacher"):
        load_published(a_out)
    rows = w2s.status(w2s.parse(["--config", _write(tmp_path, cfg)]))
    assert rows[-1]["stage"] == "collect" and rows[-1]["state"].startswith("stale (withdrawn on ")


def test_status_over_a_configuration_that_no_longer_parses_is_not_done(finished, tmp_path):
    """Issue 49, finding 10: a student option the code no longer accepts; `--status` printed "3 done"."""
    from protocols.w2s import protocol as w2s

    cfg = _copy(finished, tmp_path)
    broken = dict(cfg, student_args=cfg["student_args"] + ["--model.no_such_option=1"])
    rows = {r["stage"]: r["state"] for r in w2s.status(w2s.parse(["--config", _write(tmp_path, broken)]))}
    for stage in ("seed0/teacher", "seed0/naive"):  # a rerun refuses the whole configuration: its first bad stage
        assert rows[stage].startswith("changed (a rerun refuses it: the configuration no longer parses: stage "
                                      f"{cfg['out_dir']}/seed0/naive"[:100]), rows
    assert rows["collect"].startswith("stale (seed0/teacher, seed0/naive changed since)")


def test_orphans_of_a_dead_writer_are_swept_from_a_reused_stage(finished, tmp_path):
    cfg = _copy(finished, tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is no longer alive
    from datamodules.atomic_files import _host

    orphan = os.path.join(cfg["out_dir"], "seed0", "naive", f"result.json.tmp-{_host()}-{dead.pid}")
    open(orphan, "w").write("{half")
    run_protocol(["--config", _write(tmp_path, cfg)])
    assert not os.path.exists(orphan)


# ---- 4, 5: validated before any work, refused in one line --------------------------------------------------------
def _refused(tmp_path, cfg, message):
    with pytest.raises(ValueError, match=message):
        run_protocol(["--config", _write(tmp_path, cfg)])
    assert not os.path.exists(os.path.join(cfg["out_dir"], "seed0")), "refused only after some work"


@pytest.mark.parametrize("overrides, message", [
    ({"seeds": [0, 0]}, r"--seeds repeats \[0\]"),
    ({"methods": [{"name": "anchor", "anchor_coef": 1.0}], "paired_reference": "nosuch"},
     r"--paired_reference 'nosuch': \['nosuch'\] names no method"),
    ({"methods": [{"name": "anchor", "anchor_coef": 1.0}], "paired_reference": ["anchor", "nosuch"]},
     r"\['nosuch'\] names no method"),
    ({"methods": [{"name": "anchor", "sweep": {"--model.anchor_coef": [1, 1.0]}}]},
     r"sweep values 1 and 1.0 give the same stage"),
    ({"teacher_search": {"values": [1], "flag": "--model.freeze_layers", "band": [20.0]}},
     r"--teacher_search.band takes two numbers"),
])
def test_mislabelled_or_duplicated_work_is_refused_before_any_stage(tmp_path, word_tokenizer_dir, overrides, message):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"), **overrides)
    _refused(tmp_path, cfg, message)


def test_freeze_layers_past_the_students_depth_is_refused_before_the_teacher_trains(tmp_path, word_tokenizer_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"))
    cfg["student_args"] = cfg["student_args"] + ["--model.freeze_layers=5"]
    _refused(tmp_path, cfg, r"seed0/naive.*--model.freeze_layers 5 exceeds the depth.*it has 1 transformer layer")


def test_regime_table_refuses_two_rows_of_one_name(finished, tmp_path, capsys):
    out = str(finished[0] / "run")
    with pytest.raises(SystemExit):
        regime_table(["--run", f"a={out}", "--run", f"a={out}"])
    assert "--run names ['a'] more than once" in capsys.readouterr().err


def test_a_protocol_refusal_is_one_line_and_traceback_shows_the_traceback(tmp_path, word_tokenizer_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"), seeds=[0, 0])
    command = [sys.executable, "-m", "protocols.w2s", "--config", _write(tmp_path, cfg)]
    plain = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert plain.returncode == 2
    assert plain.stderr.startswith("error: --seeds repeats [0]: [0, 0]; each seed is one run"), plain.stderr
    assert "Traceback" not in plain.stderr and len(plain.stderr.splitlines()) == 1
    debug = subprocess.run(command + ["--traceback"], cwd=ROOT, capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_a_class_refusal_wrapped_by_jsonargparse_shows_its_own_message_first(word_tokenizer_dir, tmp_path):
    """jsonargparse wraps a subclass-mode class's ValueError in "Does not validate against any of the Union
    subtypes"; the CLI raises the class's own message."""
    from cli import main as cli_main

    with pytest.raises(ValueError) as err:
        cli_main(["fit", "--config", os.path.join(ROOT, "configs/trainer/cpu.yaml"), "--config",
                  os.path.join(ROOT, "configs/data/synth_helpful.yaml"), "--config",
                  os.path.join(ROOT, "configs/model/tiny_teacher.yaml"), f"--model.tokenizer={word_tokenizer_dir}",
                  "--model.freeze_layers=5", f"--trainer.default_root_dir={tmp_path}"])
    assert str(err.value).startswith("--model.freeze_layers 5 exceeds the depth of --model.backbone 'tiny-qwen2'")


def test_inner_cause_takes_the_class_error_out_of_the_union_wrapper():
    from cli_guards import inner_cause

    message = ("Does not validate against any of the Union subtypes\nSubtypes: [LightningModule, NoneType]\nErrors:\n"
               "  - checkpoint 'x.ckpt': member 'archive/data/3' fails its CRC-32 check\n    (truncated or corrupt)\n"
               "  - Expected a <class 'NoneType'>\nGiven value type: <class 'Namespace'>")
    assert inner_cause(message) == "checkpoint 'x.ckpt': member 'archive/data/3' fails its CRC-32 check " \
                                   "(truncated or corrupt)"
    assert inner_cause("some other error") is None


def test_a_mixture_stage_that_ends_without_its_checkpoint_says_so(tmp_path):
    from protocols.mixture.protocol import _failure

    log = tmp_path / "sft.log"
    log.write_text("$ python cli.py fit ...\n`Trainer.fit` stopped: `max_steps=1` reached.\n")
    message = _failure(0, str(tmp_path / "sft.ckpt"), str(log))
    assert message.startswith(f"the run ended (exit code 0) without writing its checkpoint {tmp_path / 'sft.ckpt'}")
    assert message.endswith("`Trainer.fit` stopped: `max_steps=1` reached.")
    assert _failure(1, "c", str(log)).startswith("`Trainer.fit` stopped")  # a crash keeps its own last error

