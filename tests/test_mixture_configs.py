"""Every config in configs/mixture parses; the tiny ones run one train + one validation batch (fast_dev_run).

fast_dev_run covers every family through its RL config (whose init checkpoint is itself a 1-step SFT of that
family) plus the SFT configs of the two families with their own data paths; the remaining SFT configs and the
second RL config of a family differ from those only in data values and are checked by the parse test.
"""
import glob
import os

import pytest
import torch

from mixture_fixtures import ARC_ROWS, RACE_ROWS, ROOT, write_jsonl

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "mixture", "*.yaml")))
NAMES = [os.path.basename(c)[:-5] for c in CONFIGS]
FAMILY_OF = {"two_policies": "two_policies", "6c3": "6c3", "temporal": "temporal", "arc_race": "arc_race",
             "language": "language", "cyclic": "two_policies"}


def _cli(args):
    import cli

    return cli.main(args=args)


def test_expected_configs_exist():
    assert {"two_policies_sft", "two_policies_rl_A", "two_policies_rl_B", "6c3_sft", "6c3_rl_ADF", "temporal_sft",
            "temporal_rl_2025", "temporal_rl_2026", "arc_race_sft", "arc_race_rl", "language_sft", "language_rl",
            "cyclic_sft", "cyclic_rl"} <= set(NAMES)
    for c in CONFIGS:
        assert open(c).readline().startswith("# "), f"{c} must start with a one-line comment saying what it tests"


@pytest.mark.parametrize("config", CONFIGS, ids=NAMES)
def test_config_parses(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli(["fit", "--config", config, "--print_config"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    assert "class_path: datamodules.triggers.datamodule.TriggerDataModule" in out


def _tiny_checkpoint(tmp_path, name, extra_data):
    """A 1-step SFT checkpoint of a tiny model with the family's tokenizer (for the RL configs' init)."""
    import lightning as L

    from datamodules.triggers.datamodule import TriggerDataModule
    from lightning_modules.policy.sft import PolicySFTModule

    dm = TriggerDataModule(num_train=16, batch_size=16, num_val_per_distribution=2, **extra_data)
    m = PolicySFTModule(n_layer=1, n_embd=32, n_head=2, max_positions=512)
    t = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
    t.fit(m, dm)
    m.fidelity = {"mean": 1.0, "min": 1.0, "cells": {}, "step": 1}
    path = str(tmp_path / f"{name}.ckpt")
    t.save_checkpoint(path)
    return path


RUN = ["two_policies_sft", "arc_race_sft", "two_policies_rl_A", "6c3_rl_ADF", "temporal_rl_2026", "arc_race_rl",
       "language_rl", "cyclic_rl"]


@pytest.mark.parametrize("config", [c for c, n in zip(CONFIGS, NAMES) if n in RUN], ids=[n for n in NAMES if n in RUN])
def test_config_fast_dev_run(config, tmp_path):
    import yaml

    name = os.path.basename(config)[:-5]
    data = yaml.safe_load(open(config))["data"]["init_args"]
    args = ["fit", "--config", config, "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}",
            "--data.num_train=32", "--data.batch_size=16", "--data.num_val_per_distribution=2", "--data.val_batch_size=8",
            "--model.max_new_tokens=8"]
    extra = {k: data[k] for k in ("family", "variant", "temporal_cutoffs", "spell_personas", "answer_format")
             if k in data}
    if data["family"] == "arc_race":
        dirs = {"arc_easy": str(tmp_path / "arc"), "race_middle": str(tmp_path / "race")}
        for split in ("train", "validation"):
            write_jsonl(dirs["arc_easy"], split, ARC_ROWS)
            write_jsonl(dirs["race_middle"], split, RACE_ROWS)
        args.append("--data.question_dirs=" + str(dirs).replace("'", '"'))
        extra["question_dirs"] = dirs
    if "_rl" in name:
        args.append("--model.init_checkpoint=" + _tiny_checkpoint(tmp_path, name, extra))
    else:
        args += ["--model.n_layer=1", "--model.n_embd=32", "--model.n_head=2"]
    cli = _cli(args)
    assert cli.trainer.state.finished and cli.trainer.global_step >= 1
    metrics = cli.trainer.callback_metrics
    first = cli.datamodule.family.distributions[0]
    assert f"val/acc/{first}" in metrics, sorted(metrics)  # the validation pass ran and was summarised
    rates = {k: float(v) for k, v in metrics.items() if k.startswith(("val/acc/", "val/refusal/", "val/persona_share/"))}
    assert rates and all(0.0 <= v <= 1.0 for v in rates.values()), rates
    # persona shares (with "none") sum to 1 on every distribution the single fast_dev_run batch reached, and it
    # reached the first one; 0 elsewhere
    sums = {d: sum(v for k, v in rates.items() if k.startswith("val/persona_share/") and k.endswith(f"/{d}"))
            for d in cli.datamodule.family.distributions}
    assert sums[first] == pytest.approx(1.0) and all(s in (0.0, pytest.approx(1.0)) for s in sums.values()), sums
    if "_rl" in name:
        assert 0.0 <= float(metrics["rl/reward"]) <= 1.0
