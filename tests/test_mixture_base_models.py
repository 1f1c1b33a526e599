"""Part B's base models (configs/mixture/base_models/): Qwen2.5, Llama 3.2 and Gemma 3 for the two-policy SFT and RL
stages. Each pair of configs runs as users run it (`cli.py fit --config two_policies_*.yaml --config <layer>`), for
2 SFT steps then 2 GRPO steps from the SFT checkpoint the SFT config writes, on a tiny random-initialised checkpoint
of the same architecture family saved as a local HF directory (config.json with its model_type, safetensors, a
local tokenizer): the real loading path of a hub download, with the hub id swapped for that directory.
"""
import glob
import os

import pytest
import torch
import yaml

from mixture_fixtures import ROOT

LAYERS = os.path.join(ROOT, "configs", "mixture", "base_models")
BASE = {"sft": os.path.join(ROOT, "configs", "mixture", "two_policies_sft.yaml"),
        "rl_A": os.path.join(ROOT, "configs", "mixture", "two_policies_rl_A.yaml")}
# config name -> (architecture family of the stand-in, hub id the config names)
MODELS = {"qwen2.5-1.5b": ("qwen2", "Qwen/Qwen2.5-1.5B"), "llama3.2-1b": ("llama", "meta-llama/Llama-3.2-1B"),
          "gemma3-1b": ("gemma3_text", "google/gemma-3-1b-pt"), "smollm2": ("llama", "smollm2")}
SMALL = ["--trainer.accelerator=cpu", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
         "--trainer.log_every_n_steps=1", "--data.num_train=8", "--data.batch_size=4",
         "--data.num_val_per_distribution=2", "--data.val_batch_size=8", "--model.max_new_tokens=6"]


def _cli(args):
    import cli

    return cli.main(args=args)


def _stand_in(family: str, out_dir: str) -> str:
    from benchmarks.tiny_families import build_model_dir
    from datamodules.triggers.datamodule import TriggerDataModule

    words = TriggerDataModule(family="two_policies", restate_trigger=True).vocabulary_words()
    return build_model_dir(family, out_dir, words, layers=2, scale="tiny")


def test_every_base_model_has_both_stages():
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(LAYERS, "*.yaml")))
    assert names == sorted(f"{m}_{s}" for m in MODELS for s in ("sft", "rl_A"))
    for name, (_, hub_id) in MODELS.items():
        sft = yaml.safe_load(open(os.path.join(LAYERS, f"{name}_sft.yaml")))
        rl = yaml.safe_load(open(os.path.join(LAYERS, f"{name}_rl_A.yaml")))
        assert sft["model"]["init_args"]["backbone"] == hub_id
        assert sft["trainer"]["precision"] == rl["trainer"]["precision"] == "bf16-mixed"
        assert sft["model"]["init_args"]["tokenizer"] == rl["model"]["init_args"]["tokenizer"]
        # the RL stage starts from the checkpoint the SFT stage writes
        ckpt = sft["trainer"]["callbacks"][-1]["init_args"]
        assert rl["model"]["init_args"]["init_checkpoint"] == f"{ckpt['dirpath']}/{ckpt['filename']}.ckpt"
        for path in (f"{name}_sft.yaml", f"{name}_rl_A.yaml"):
            assert open(os.path.join(LAYERS, path)).readline().startswith("# ")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_base_model_config_parses(name):
    from protocols.engine.stage_identity import resolve_cli_config

    for stage in ("sft", "rl_A"):
        cfg = resolve_cli_config(["--config", BASE[stage], "--config", os.path.join(LAYERS, f"{name}_{stage}.yaml")])
        model = cfg["model"]["init_args"]
        assert cfg["trainer"]["precision"] == "bf16-mixed" and cfg["trainer"]["accelerator"] == "gpu"
        assert cfg["data"]["init_args"]["tokenizer"] == model["tokenizer"]  # cli.py's link
        assert cfg["data"]["init_args"]["family"] == "two_policies"
        if stage == "sft":
            assert model["backbone"] == MODELS[name][1] and model["lr"] == 1e-5
        else:
            assert model["algorithm"] == "grpo" and model["lr"] == 1e-6


@pytest.mark.parametrize("name", sorted(MODELS))
def test_base_model_sft_then_rl_on_a_tiny_stand_in(name, tmp_path, monkeypatch):
    family, _ = MODELS[name]
    stand_in = _stand_in(family, str(tmp_path / f"tiny-{family}"))
    assert yaml.safe_load(open(os.path.join(stand_in, "config.json")))["model_type"] == family
    monkeypatch.chdir(tmp_path)  # the configs' runs/ paths (logs, checkpoints, the RL init) land here
    monkeypatch.setenv("SHIFTGEN_CACHE", str(tmp_path / "cache"))
    swap = [f"--model.tokenizer={stand_in}"]

    sft = _cli(["fit", "--config", BASE["sft"], "--config", os.path.join(LAYERS, f"{name}_sft.yaml"), *SMALL,
                f"--model.backbone={stand_in}", *swap, "--model.fidelity_prompts_per_distribution=2"])
    assert sft.trainer.global_step == 2
    assert sft.model.model.config.model_type == family
    assert sft.trainer.precision == "bf16-mixed"
    ckpt_path = tmp_path / "runs" / "mixture" / "checkpoints" / f"two_policies_{name}" / "sft.ckpt"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    assert "optimizer_states" not in ckpt and ckpt["tokenizer_fingerprint"]  # weights only, still checked by RL
    assert ckpt["hyper_parameters"]["backbone"] == stand_in
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(stand_in).state_dict()
    trained = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    assert set(trained) == set(start)
    changed = [k for k in start if not torch.equal(start[k], trained[k].to(start[k].dtype))]
    assert len(changed) >= len(start) // 2, f"2 SFT steps changed only {len(changed)} of {len(start)} tensors"

    rl = _cli(["fit", "--config", BASE["rl_A"], "--config", os.path.join(LAYERS, f"{name}_rl_A.yaml"), *SMALL, *swap,
               "--model.min_sft_fidelity=0", "--model.group_size=2", "--trainer.num_sanity_val_steps=0"])
    assert int(rl.model.rl_step) == 2 and rl.trainer.global_step >= 2
    assert rl.model.model.config.model_type == family  # built from the SFT checkpoint's backbone
    for key, value in trained.items():  # and started from its weights (then 2 steps at lr 1e-6)
        assert torch.allclose(rl.model.model.state_dict()[key].float(), value.float(), atol=1e-4), key
    from callbacks.persona_tracking import PersonaTrackingCallback

    (tracking,) = [c for c in rl.trainer.callbacks if isinstance(c, PersonaTrackingCallback)]
    assert [h["step"] for h in tracking.history] == [2]  # the evaluation on every distribution ran at step 2
    assert {"val/acc/A", "val/acc/B"} <= set(tracking.history[0]["metrics"])
    assert (tmp_path / "runs" / "mixture" / "checkpoints" / f"two_policies_{name}" / "rl_A.ckpt").is_file()
