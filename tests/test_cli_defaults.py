"""cli.py's defaults do what a user expects (issue 47.2; docs/reward_model.md, "Command line"; docs/data.md, "Your own
files"): `--data.source local:DIR` alone trains on every training pair of DIR; `--trainer.default_root_dir` and
`--name` decide where a run writes; `test` of a fit's checkpoint writes beside it, with no new version folder; `fit`
ends with its best and last validation and checkpoint paths; `test` prints one table; `--name` / `--verbose` enter
no stage identity."""
import json
import math
import os
import re
import sys
from unittest import mock

import pytest

from callbacks.run_summary import RunSummary, best_entry, find_run_summary
from cli import main
from datamodules.preference.datamodule import data_summary
from datamodules.preference.example_files import trl_rows, write_jsonl
from protocols.engine.stage_identity import resolve_cli_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = os.path.join(ROOT, "configs", "trainer", "cpu.yaml")
TINY = os.path.join(ROOT, "configs", "model", "tiny_teacher.yaml")  # word-level tokenizer of the synthetic texts
LOCAL = os.path.join(ROOT, "configs", "data", "local.yaml")
N_TRAIN, N_VAL, N_TEST, BATCH = 44, 8, 12, 8
# one epoch, no pretty tables, the batch size the counts below are checked against
SMALL = ["--trainer.max_epochs=1", f"--data.batch_size={BATCH}", "--data.eval_batch_size=16", "--data.max_length=96"]


def write_pairs(folder) -> str:
    """A folder in TRL's standard layout, as a user's own: train.jsonl (N_TRAIN pairs), validation.jsonl, test.jsonl."""
    os.makedirs(folder, exist_ok=True)
    write_jsonl(os.path.join(folder, "train.jsonl"), trl_rows("helpful", "cooking", "train", N_TRAIN, seed=1))
    write_jsonl(os.path.join(folder, "validation.jsonl"), trl_rows("helpful", "cooking", "train", N_VAL, seed=2))
    write_jsonl(os.path.join(folder, "test.jsonl"), trl_rows("helpful", "cooking", "test", N_TEST, seed=1))
    return str(folder)


def run(args: list[str]):
    with mock.patch.object(sys, "argv", ["cli.py"]):  # as from a shell (pytest's own arguments are not ours)
        return main(args)


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    """The working directory is a fresh folder: the default `runs/` would appear there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def printed(capfd, caplog, logs_only: bool = False) -> str:
    """What a run printed: its streams, and Lightning's log records (its handler holds a stream pytest replaced;
    `logs_only`: the records alone, where a line is counted)."""
    out, err = capfd.readouterr()
    logs = "".join(r.getMessage() + "\n" for r in caplog.records)
    caplog.clear()
    return logs if logs_only else out + err + logs


def _files(folder) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs}


# ---- --data.source local:DIR alone trains on every training pair ----------------------------------------------------
@pytest.mark.parametrize("data_config", [[], ["--config", LOCAL]], ids=["no data config", "configs/data/local.yaml"])
def test_local_source_alone_trains_on_every_training_pair(data_config, in_tmp, capfd, caplog):
    pairs = write_pairs(in_tmp / "my_pairs")
    printed(capfd, caplog)
    fit = run(["fit", "--config", CPU, "--config", TINY, *data_config, f"--data.source=local:{pairs}", *SMALL,
               f"--data.cache_dir={in_tmp / 'cache'}"])  # a fresh cache: the splits are tokenized and saved here
    dm = fit.datamodule
    assert type(dm).__name__ == "PreferenceDataModule" and dm.hparams.train_subset == "all"
    assert len(dm._train_set()) == N_TRAIN  # every pair of train.jsonl (validation.jsonl given: nothing carved)
    assert fit.trainer.num_training_batches == math.ceil(N_TRAIN / BATCH)
    seen = sum(len(batch["labels"]) for batch in dm.train_dataloader())
    assert seen == N_TRAIN
    err = printed(capfd, caplog)
    assert f"[data] train {N_TRAIN} pairs (the whole train split: --data.train_subset all); validation {N_VAL}; " \
           f"test local:{pairs} {N_TEST}" in err
    assert "train_teacher" not in err
    # quiet: no Lightning tip, no datasets progress bars; the run's own lines, and the default place (nothing given)
    assert "[fit] best validation" in err
    assert "💡 Tip" not in err and "Saving the dataset" not in err and "tokenizing" not in err
    assert os.path.isdir("runs/default/version_0")


def test_short_class_names_and_the_default_data_class():
    config = resolve_cli_config(["--config", CPU, "--model", "RewardModelModule", "--model.tokenizer=x",
                                 "--data", "PreferenceDataModule", "--data.source=local:somewhere"])
    assert config["model"]["class_path"] == "lightning_modules.reward.reward_model.RewardModelModule"
    assert config["data"]["class_path"] == "datamodules.preference.datamodule.PreferenceDataModule"
    alone = resolve_cli_config(["--config", CPU, "--config", TINY, "--data.source=local:somewhere"])
    assert alone["data"] == {**config["data"], "init_args": {**config["data"]["init_args"],
                                                             "tokenizer": "builtin:synthetic_shift"}}


# ---- where a run writes ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A fit with --trainer.default_root_dir and --name, run in a fresh working directory (kept for the module's
    tests, which run there too)."""
    folder = tmp_path_factory.mktemp("work")
    before = os.getcwd()
    os.chdir(folder)
    try:
        pairs = write_pairs(folder / "my_pairs")
        root = folder / "elsewhere"
        fit = run(["fit", "--config", CPU, "--config", TINY, f"--data.source=local:{pairs}", *SMALL,
                   f"--trainer.default_root_dir={root}", "--name", "my_rm"])
        yield fit, pairs, root, folder
    finally:
        os.chdir(before)


@pytest.fixture()
def in_fitted(fitted, monkeypatch):
    monkeypatch.chdir(fitted[3])
    return fitted[:3]


def test_default_root_dir_and_name_decide_where_a_fit_writes(in_fitted):
    fit, _, root = in_fitted
    version = root / "my_rm" / "version_0"
    assert fit.trainer.log_dir == str(version)
    written = _files(version)
    assert {"config.yaml", "hparams.yaml", "data_manifest.json", "checkpoints/last.ckpt"} <= written
    assert not os.path.exists("runs")  # the default logger's folder (in the working directory): not used
    config = open(version / "config.yaml").read()
    assert "name: my_rm" in config and f"save_dir: {root}" in config
    assert not re.search(r"^(name|verbose):", config, re.M)  # run options are no part of the run's config


def test_fit_ends_with_best_and_last_validation_and_existing_checkpoints(in_fitted):
    fit, _, _ = in_fitted
    summary = find_run_summary(fit.trainer)
    lines = summary.lines
    assert lines[0].startswith("[fit] best validation (epoch 0, step 6): val/acc ")
    assert "-- by val/acc (max)" in lines[0]
    paths = [line.split("checkpoint ", 1)[1] for line in lines if line.strip().startswith("checkpoint ")]
    assert len(paths) == 2 and paths[1].endswith("last.ckpt")
    assert all(os.path.isfile(p) for p in paths)
    assert os.path.samefile(paths[0], fit.trainer.checkpoint_callback.best_model_path)
    best_acc = float(re.search(r"val/acc ([0-9.]+)", lines[0])[1])
    assert best_acc == pytest.approx(float(fit.trainer.checkpoint_callback.best_model_score), abs=1e-4)
    assert any(line.startswith("[fit] logs ") and "my_rm/version_0" in line for line in lines)


def test_a_test_of_a_fits_checkpoint_writes_beside_it_and_prints_one_table(in_fitted, capfd, caplog):
    fit, pairs, root = in_fitted
    ckpt = os.path.join(fit.trainer.log_dir, "checkpoints", "last.ckpt")
    before = set(os.listdir(root / "my_rm"))
    printed(capfd, caplog)
    test = run(["test", "--config", CPU, "--config", TINY, f"--data.source=local:{pairs}", *SMALL,
                f"--ckpt_path={ckpt}"])
    assert set(os.listdir(root / "my_rm")) == before == {"version_0"}  # no new version folder
    beside = os.path.join(fit.trainer.log_dir, "test", "last")
    assert os.path.samefile(test.trainer.log_dir, beside)
    results = json.load(open(os.path.join(beside, "test_results.json")))
    assert results[f"local:{pairs}"]["pairs"] == N_TEST
    out, err = capfd.readouterr()
    logs = printed(capfd, caplog, logs_only=True)
    assert logs.count("| split | role | pairs | accuracy |") == 1  # the project's table, once
    text = out + err + logs
    assert "Test metric" not in text and "DataLoader 0" not in text  # Lightning's own table: only with --verbose
    assert not os.path.exists("runs")


def test_verbose_brings_back_lightnings_table_and_tip(in_fitted, capfd, caplog):
    fit, pairs, root = in_fitted
    ckpt = os.path.join(fit.trainer.log_dir, "checkpoints", "last.ckpt")
    printed(capfd, caplog)
    run(["test", "--config", CPU, "--config", TINY, f"--data.source=local:{pairs}", *SMALL, f"--ckpt_path={ckpt}",
         "--verbose"])
    text = printed(capfd, caplog)
    assert "Test metric" in text and "💡 Tip" in text and "GPU available:" in text
    run(["test", "--config", CPU, "--config", TINY, f"--data.source=local:{pairs}", *SMALL, f"--ckpt_path={ckpt}",
         "--verbose=false"])  # as the W2S protocol passes it
    text = printed(capfd, caplog)
    assert "Test metric" not in text and "💡 Tip" not in text and "GPU available:" not in text
    # validate has no table of the project's own: Lightning's is its output, unless --verbose=false
    for extra, shown in (([], True), (["--verbose=false"], False)):
        run(["validate", "--config", CPU, "--config", TINY, f"--data.source=local:{pairs}", *SMALL,
             f"--ckpt_path={ckpt}", *extra])
        assert ("Validate metric" in printed(capfd, caplog)) is shown


def test_name_and_an_explicit_logger_name_that_disagree_fail_in_one_line(in_tmp, capsys):
    with mock.patch.object(sys, "argv", ["cli.py"]), pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", CPU, "--config", TINY, "--data.source=local:x", "--name", "a",
              "--trainer.logger.init_args.name=b"])
    assert exit_info.value.code == 2
    assert "--name a and --trainer.logger.init_args.name b disagree" in capsys.readouterr().err


# ---- run options enter no identity -----------------------------------------------------------------------------------
def test_run_options_enter_no_stage_identity():
    base = ["--config", CPU, "--config", TINY, "--config", os.path.join(ROOT, "configs", "data", "synth_helpful.yaml")]
    plain = resolve_cli_config(base)
    named = resolve_cli_config([*base, "--name", "x", "--verbose"])
    assert named == plain
    assert "name" not in plain and "verbose" not in plain


# ---- the pieces -------------------------------------------------------------------------------------------------
def test_data_summary_says_what_trains():
    manifest = {"sizes": {"train_teacher": 48, "train_student": 47, "validation": 5, "test/local:d": 50},
                "dropped": {"local:d/train": {}, "local:d/test": {"tie": 2}},
                "tokenization": {"train_teacher": {"ok": 48, "cached": True},
                                 "validation": {"ok": 4, "truncated_prompt": 1, "cached": False}}}
    assert data_summary(manifest, "all") == (
        "[data] train 95 pairs (the whole train split: --data.train_subset all); validation 5; test local:d 50; "
        "dropped {'local:d/test': {'tie': 2}}; truncation {'validation': {'truncated_prompt': 1}}")
    assert data_summary(manifest, "student").startswith(
        "[data] train 47 pairs (the student half of 95: --data.train_subset student; the other half's 48 unused); ")


def test_best_entry_is_the_first_best_under_the_mode():
    history = [{"epoch": 0, "step": s, "metrics": {"val/acc": a, "val/loss": l}}
               for s, a, l in [(1, 0.5, 0.9), (2, 0.7, 0.6), (3, 0.7, 0.5), (4, float("nan"), 0.4)]]
    assert best_entry(history, "val/acc", "max")["step"] == 2  # ModelCheckpoint keeps the earlier of equal values
    assert best_entry(history, "val/loss", "min")["step"] == 4
    assert best_entry(history, None) is None
    assert RunSummary().history == []


def test_the_own_pairs_example_of_docs_data_md_writes_what_its_comment_says(tmp_path):
    """docs/data.md's block: its shell lines write the files, and the `[data]` line it quotes is what those files
    give (190 of 200 train pairs after the 5% validation carve, 40 test pairs)."""
    import subprocess

    from datamodules.preference.datamodule import PreferenceDataModule

    text = open(os.path.join(ROOT, "docs", "data.md")).read()
    block = text[text.index("```bash\nmkdir -p my_data/my_pairs") + len("```bash\n"):]
    block = block[:block.index("```")]
    writing = block[:block.index("python cli.py fit")]
    subprocess.run(["bash", "-euo", "pipefail", "-c", writing], cwd=tmp_path, check=True)
    quoted = re.search(r"#\s+(\[data\] .*)", block)[1]
    dm = PreferenceDataModule(source="local:my_data/my_pairs", cache_dir=str(tmp_path / "cache"))
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        records, _ = dm.load_records()
    finally:
        os.chdir(old)
    sizes = {k: len(v) for k, v in records.items()}
    manifest = {"sizes": sizes, "dropped": {}, "tokenization": {}}
    assert data_summary(manifest, "all") == quoted
    assert sizes["train_teacher"] + sizes["train_student"] == 190 and sizes["test/local:my_data/my_pairs"] == 40
