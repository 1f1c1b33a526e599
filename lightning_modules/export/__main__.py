"""`python cli.py export --ckpt_path X --out_dir D [--lora_only] [--results R]` (also `python -m lightning_modules.export`).

A reward-model checkpoint becomes a transformers reward model directory, a policy checkpoint a causal-LM directory
(docs/export.md); the kind is read from the checkpoint.
"""
from __future__ import annotations

import argparse
import os
from typing import Optional


def checkpoint_kind(ckpt: dict) -> str:
    """"reward" (RewardModelModule) or "policy" (PolicySFTModule / PolicyRLModule), from the saved weights."""
    keys = ckpt.get("state_dict", {})
    if "head.score.weight" in keys or str(ckpt.get("hyper_parameters", {}).get("backbone", "")).startswith("hf_classifier:"):
        return "reward"
    if any(k.startswith("model.") for k in keys) and "tokenizer_fingerprint" in ckpt:
        return "policy"
    raise ValueError("--ckpt_path is neither a reward model (RewardModelModule) nor a policy (PolicySFTModule / "
                     "PolicyRLModule) checkpoint of this codebase")


def export_checkpoint(ckpt_path: str, out_dir: str, lora_only: bool = False, results: Optional[str] = None) -> dict:
    import torch

    from datamodules.preference.datamodule import check_checkpoint_file

    check_checkpoint_file(ckpt_path, "--ckpt_path")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ValueError(f"--out_dir {out_dir!r} exists and is not empty; choose a new directory")
    if os.path.isdir(out_dir):
        os.rmdir(out_dir)  # empty: replaced atomically by the finished export
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    if checkpoint_kind(ckpt) == "reward":
        from lightning_modules.export.reward_model import export_reward_model

        return export_reward_model(ckpt, ckpt_path, out_dir, lora_only, results)
    from lightning_modules.export.policy import export_policy

    return export_policy(ckpt, ckpt_path, out_dir, lora_only, results)


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(prog="cli.py export", description=__doc__.split("\n\n")[1])
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt of RewardModelModule or a policy module")
    parser.add_argument("--out_dir", required=True, help="new directory for the export (must not exist or be empty)")
    parser.add_argument("--lora_only", action="store_true",
                        help="reward models trained with --model.lora: save a PEFT adapter instead of merged weights")
    parser.add_argument("--results", default=None,
                        help="test results JSON for the model card (test_results.json, or a protocol stage's "
                             "result.json); default: the protocol's result.json beside the checkpoint, if any")
    args = parser.parse_args(argv)
    from command_errors import one_line
    from lightning_modules.export.reward_model import ExportError

    try:
        facts = export_checkpoint(args.ckpt_path, args.out_dir, args.lora_only, args.results)
    except ExportError as err:  # one line, as every command's refusal (command_errors.py)
        parser.exit(2, f"error: cli.py export refused: {one_line(str(err))}\n")
    except ValueError as err:
        parser.exit(2, f"error: cli.py export: {one_line(str(err))}\n")
    print(f"exported {facts['kind']} to {os.path.abspath(args.out_dir)} (model card: README.md)")
    return facts


if __name__ == "__main__":
    from command_errors import exit_with, run_command

    exit_with(run_command(main, prog="python -m lightning_modules.export"))
