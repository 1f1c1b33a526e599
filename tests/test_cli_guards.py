"""cli.py's guards: a checkpoint never silently overrides an explicit value; objective registry names on the
command line; a mistyped key leads the error with its closest valid key (docs/reward_model.md, "Command line")."""
import json
import os
import sys
from unittest import mock

import pytest
import torch
import yaml
from jsonargparse import ArgumentError

import cli
from cli import main
from lightning_modules.reward.objectives import OBJECTIVES, SoftBradleyTerry
from tests.test_cli_configs import CPU, SMALL_SYNTH, SYNTH, TINY

BASE = ["--config", CPU, "--config", TINY, "--config", SYNTH, f"--data.source_options={SMALL_SYNTH}"]
FIT_ONLY = ["--model.center_rewards_coef=0.25"]  # differs from the default (0.0)


def _error_lines(args: list[str], capsys) -> list[str]:
    # sys.argv as from a shell: with pytest's own arguments there, Lightning warns on stderr that both are given
    with mock.patch.object(sys, "argv", ["cli.py"]), pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.splitlines()


def _yaml(tmp_path, name: str, tree: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return str(path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny reward model fitted one step with `FIT_ONLY`, saved with its hyperparameters."""
    root = tmp_path_factory.mktemp("fit")
    fit = main(["fit", *BASE, *FIT_ONLY, f"--data.cache_dir={root / 'cache'}", "--trainer.fast_dev_run=true",
                f"--trainer.default_root_dir={root}", "--trainer.logger=false"])
    path = str(root / "model.ckpt")
    fit.trainer.save_checkpoint(path)
    return path


# ---- 1. the checkpoint and the command line never silently disagree ----------------------------------------------
@pytest.mark.parametrize("subcommand,given_in", [("test", "flags"), ("fit", "config file")])
def test_explicit_values_differing_from_the_checkpoint_fail_before_any_work(subcommand, given_in, checkpoint,
                                                                          tmp_path, capsys, monkeypatch):
    built = []
    monkeypatch.setattr(cli.ShiftCLI, "instantiate_classes", lambda self: built.append(self))
    tiny = {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2}  # the checkpoint's, but for hidden_size (64)
    if given_in == "flags":
        extra = ["--model.center_rewards_coef=5", f"--model.tiny_config={json.dumps(tiny)}"]
    else:
        extra = ["--config", _yaml(tmp_path, "delta.yaml", {"model": {"init_args": {
            "center_rewards_coef": 5, "tiny_config": tiny}}})]
    lines = _error_lines([subcommand, *BASE, *extra, f"--ckpt_path={checkpoint}",
                          f"--trainer.default_root_dir={tmp_path / 'run'}"], capsys)
    error = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert lines[error].startswith(f"error: --ckpt_path {checkpoint}: the model is built from the checkpoint's")
    # every differing key, and only those (backbone, tokenizer, pooling are given too, with the checkpoint's values)
    assert sorted(line.strip() for line in lines if line.startswith("  --model.")) == [
        "--model.center_rewards_coef: checkpoint 0.25, command line 5.0",
        "--model.tiny_config.hidden_size: checkpoint 64, command line 32",
    ]
    assert built == [] and not (tmp_path / "run").exists()


def test_the_same_values_as_the_fit_run(checkpoint, tmp_path):
    """What protocols/w2s/protocol.py does: `test` with the fit's own arguments and --ckpt_path."""
    test = main(["test", *BASE, *FIT_ONLY, f"--ckpt_path={checkpoint}", f"--data.cache_dir={tmp_path / 'cache'}",
                 f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--verbose=false"])
    assert test.model.hparams.center_rewards_coef == 0.25
    assert {name: r["pairs"] for name, r in test.model.test_results.items()} == {
        "synth_helpful_cooking": 16, "synth_helpful_science": 16, "synth_helpful_travel": 16, "synth_helpful_tech": 16}


def test_unset_values_come_from_the_checkpoint_and_config_yaml_records_them(checkpoint, tmp_path):
    test = main(["test", *BASE, f"--ckpt_path={checkpoint}", f"--data.cache_dir={tmp_path / 'cache'}",
                 f"--trainer.logger.init_args.save_dir={tmp_path}", "--verbose=false"])
    assert test.model.hparams.center_rewards_coef == 0.25  # not given here: the checkpoint's, not the default 0.0
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(test.model.head.score.weight, saved["head.score.weight"])
    with open(os.path.join(test.trainer.log_dir, "config.yaml")) as f:
        assert yaml.safe_load(f)["model"]["init_args"]["center_rewards_coef"] == 0.25


# ---- 2. objective registry names -----------------------------------------------------------------------------------
def test_objective_registry_name_trains_like_its_class_path(checkpoint, tmp_path):
    """Soft labels (the checkpoint as teacher), on which naive, gold and confidence all give other losses or fail."""
    losses = {}
    for form in ["naive", json.dumps({"class_path": "lightning_modules.reward.objectives.SoftBradleyTerry"})]:
        fit = main(["fit", *BASE, f"--model.objective={form}", "--data.train_subset=student",
                    f"--data.teacher_checkpoint={checkpoint}", f"--data.cache_dir={tmp_path / 'cache'}",
                    "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
        assert type(fit.model.objective) is SoftBradleyTerry
        assert fit.config.fit.model.init_args.objective.class_path == "lightning_modules.reward.objectives.SoftBradleyTerry"
        losses[form] = float(fit.trainer.callback_metrics["train/pref_loss"])
    assert len(set(losses.values())) == 1, losses


def _print_config(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("given_in", ["flags", "config file"])
def test_objective_registry_name_with_init_args_prints_a_reproducible_config(given_in, tmp_path, capsys):
    if given_in == "flags":
        extra = ["--model.objective", "confidence", "--model.objective.init_args.aux_coef", "0.3"]
    else:
        extra = ["--config", _yaml(tmp_path, "delta.yaml", {"model": {"init_args": {"objective": {
            "class_path": "confidence", "init_args": {"aux_coef": 0.3}}}}})]
    printed = _print_config([*BASE, *extra], capsys)
    objective = yaml.safe_load(printed)["model"]["init_args"]["objective"]
    assert objective == {"class_path": "lightning_modules.reward.objectives.ConfidenceW2S",
                         "init_args": {"aux_coef": 0.3, "warmup_fraction": 0.1, "ramp": "linear",
                                       "hardening": "top", "label_temperature": 1.0, "label_smoothing": 0.0}}
    (tmp_path / "printed.yaml").write_text(printed)
    assert _print_config(["--config", str(tmp_path / "printed.yaml")], capsys) == printed


def test_unknown_objective_name_fails_listing_the_registered_ones(capsys):
    lines = _error_lines(["fit", *BASE, "--model.objective", "naiv"], capsys)
    assert lines[0].startswith(f"error: --model.objective: unknown objective 'naiv'; registered: {sorted(OBJECTIVES)}")


# ---- 3. a mistyped key comes first, with the closest valid one -----------------------------------------------------
TYPOS = {  # id: (extra arguments or a YAML delta, the expected first line)
    "model flag": (["--model.anchor_cof", "5"], "unknown key 'model.init_args.anchor_cof' — did you mean 'anchor_coef'?"),
    "model yaml": ({"model": {"init_args": {"anchor_cof": 5}}},
                   "unknown key 'model.init_args.anchor_cof' — did you mean 'anchor_coef'?"),
    "objective yaml": ({"model": {"init_args": {"objective": {"class_path": "confidence", "init_args": {"aux_cof": 0.3}}}}},
                       "unknown key 'model.init_args.objective.init_args.aux_cof' — did you mean 'aux_coef'?"),
    "trainer yaml": ({"trainer": {"max_epoch": 3}}, "unknown key 'trainer.max_epoch' — did you mean 'max_epochs'?"),
    "group flag": (["--trainr.max_epochs", "3"], "unknown key 'trainr.max_epochs' — did you mean 'trainer'?"),
}


@pytest.mark.parametrize("typo", TYPOS)
def test_a_mistyped_key_leads_the_error_with_the_closest_valid_key(typo, tmp_path, capsys):
    extra, expected = TYPOS[typo]
    if isinstance(extra, dict):
        extra = ["--config", _yaml(tmp_path, "typo.yaml", extra)]
    lines = _error_lines(["fit", *BASE, *extra], capsys)
    assert lines[0] == f"error: {expected}"
    assert lines[1].startswith("usage:")  # jsonargparse's own text follows, unchanged


def test_without_exit_on_error_the_mistyped_key_heads_the_raised_message():
    """How protocols/ parse stage arguments (parser_kwargs={"exit_on_error": False})."""
    from lightning.pytorch import LightningDataModule, LightningModule

    with pytest.raises(ArgumentError) as raised:
        cli.ShiftCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                     parser_kwargs={"exit_on_error": False}, args=["fit", *BASE, "--model.anchor_cof=5"])
    assert str(raised.value).splitlines()[0] == TYPOS["model flag"][1]
