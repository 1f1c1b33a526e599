"""Every config in configs/ parses; the tiny ones, and the paper-scale ones pointed at tiny local models and
fixture data, run one batch with --trainer.fast_dev_run."""
import glob
import json
import os

import pytest

from cli import main
from tests.conftest import HUB_FIXTURES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = os.path.join(ROOT, "configs")
CPU = os.path.join(CFG, "trainer", "cpu.yaml")
TINY = os.path.join(CFG, "model", "tiny_teacher.yaml")
SYNTH = os.path.join(CFG, "data", "synth_helpful.yaml")
REAL_DATA = ["helpsteer3", "hh_helpful", "ultrafeedback", "hh_harmless", "pku_saferlhf", "rail"]
SMALL_SYNTH = json.dumps({n: {"n_train": 64, "n_validation": 16, "n_test": 16} for n in
                          ["synth_helpful_cooking", "synth_helpful_science", "synth_helpful_travel", "synth_helpful_tech"]})


def _print_config(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


def _combo(path: str) -> list[str]:
    """A full fit configuration around one config file."""
    kind = os.path.basename(os.path.dirname(path))
    trainer = path if kind == "trainer" else CPU
    model = path if kind == "model" else TINY
    data = path if kind == "data" else SYNTH
    return ["--config", trainer, "--config", model, "--config", data]


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(CFG, "trainer", "*.yaml"))
                                        + glob.glob(os.path.join(CFG, "model", "*.yaml"))
                                        + glob.glob(os.path.join(CFG, "data", "*.yaml"))),
                         ids=lambda p: os.path.relpath(p, CFG))
def test_config_parses(path, capsys):
    out = _print_config(_combo(path), capsys)
    assert "class_path: lightning_modules.reward.reward_model.RewardModelModule" in out
    assert "class_path: datamodules.preference.datamodule.PreferenceDataModule" in out


def test_tokenizer_is_linked_from_the_model(word_tokenizer_dir):
    cli = main(["--config", CPU, "--config", TINY, "--config", SYNTH,
                f"--model.tokenizer={word_tokenizer_dir}", "--trainer.logger=false"], run=False)
    assert cli.datamodule.tokenizer_name == cli.model.tokenizer_name == word_tokenizer_dir


def _fast_dev_run(args, tmp_path):
    cli = main(["fit", *args, "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}",
                "--trainer.logger=false"])
    assert cli.trainer.state.finished
    return cli


def test_tiny_demo_configs_fast_dev_run(tmp_path, cache_dir):
    cli = _fast_dev_run(["--config", CPU, "--config", TINY, "--config", SYNTH, f"--data.cache_dir={cache_dir}",
                         f"--data.source_options={SMALL_SYNTH}"], tmp_path)
    assert cli.model.backbone.config.num_hidden_layers == 1


@pytest.mark.parametrize("source", REAL_DATA)
def test_real_dataset_configs_on_fixtures(source, tmp_path, cache_dir, word_tokenizer_dir):
    data = os.path.join(CFG, "data", f"{source}.yaml")
    import yaml

    names = [yaml.safe_load(open(data))["data"]["init_args"]["source"]]
    names += yaml.safe_load(open(data))["data"]["init_args"]["ood_targets"]
    local = json.dumps({n: os.path.join(HUB_FIXTURES, n) for n in names})
    _fast_dev_run(["--config", CPU, "--config", TINY, "--config", data, f"--model.tokenizer={word_tokenizer_dir}",
                   f"--data.local_dirs={local}", f"--data.cache_dir={cache_dir}", "--data.val_fraction=0.3",
                   "--data.teacher_fraction=0.5"], tmp_path)


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-7b-lora", "llama3.2-1b", "llama3.1-8b-lora"])
def test_paper_scale_model_configs_on_tiny_models(model, tmp_path, cache_dir, word_tokenizer_dir):
    family = "tiny-llama" if model.startswith("llama") else "tiny-qwen2"
    local = json.dumps({n: os.path.join(HUB_FIXTURES, n) for n in ["hh_helpful", "helpsteer3", "ultrafeedback"]})
    cli = _fast_dev_run(["--config", CPU, "--config", os.path.join(CFG, "model", f"{model}.yaml"),
                         "--config", os.path.join(CFG, "data", "hh_helpful.yaml"), f"--model.backbone={family}",
                         f"--model.tokenizer={word_tokenizer_dir}", "--model.dtype=null", f"--data.local_dirs={local}",
                         f"--data.cache_dir={cache_dir}", "--data.val_fraction=0.3"], tmp_path)
    if "lora" in model:
        trainable = {n for n, p in cli.model.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
