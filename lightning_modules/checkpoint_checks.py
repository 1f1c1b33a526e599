"""Checks of a checkpoint file before its weights are used: intact, loadable, of the expected kind, finite.

`verify_archive` (every zip member's CRC-32, which `torch.load` never verifies) reads the file only, so it lives on
the data floor (`datamodules/checkpoint_archive.py`: the data module checks `--data.teacher_checkpoint` with it) and
is re-exported here. `first_nonfinite` finds a NaN / inf weight, which would otherwise train (or label) silently into
NaN margins; `load_checked` runs all of them.

Used by the teacher's loading (`lightning_modules/reward/weak_labeller.py`), the policies' `--model.init_checkpoint`
(`policy/base.py`), `--ckpt_path` (`cli.py`, and `checkpoint_io.AtomicCheckpointIO.load_checkpoint`).
"""
from __future__ import annotations

import pickle
from typing import Any, Iterable, Optional

import torch

from datamodules.checkpoint_archive import CheckpointError, verify_archive  # noqa: F401 -- re-exported

POLICY_CLASSES = ("PolicySFTModule", "PolicyRLModule")
REWARD_CLASSES = ("RewardModelModule",)


def first_nonfinite(state_dict: dict) -> Optional[str]:
    """The name of the first floating tensor holding a NaN or an infinity, or None."""
    for name, value in state_dict.items():
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return name
    return None


def check_finite(state_dict: dict, path: str, flag: str) -> None:
    """Refuse weights with a NaN / inf, naming the first such tensor and how many of its values are bad."""
    name = first_nonfinite(state_dict)
    if name is not None:
        value = state_dict[name]
        bad = int((~torch.isfinite(value)).sum())
        raise CheckpointError(f"{flag} {path!r} has non-finite weights: {name} {tuple(value.shape)} holds {bad} "
                              f"NaN/inf value(s) of {value.numel()}; a diverged run? Use an earlier checkpoint")


def checkpoint_class(ckpt: dict) -> Optional[str]:
    """The LightningModule class that wrote `ckpt` (by name), from LightningCLI's `_class_path` or, for checkpoints
    saved by a bare Trainer, from what only that class saves. None when it is none of ours."""
    hparams = ckpt.get("hyper_parameters") or {}
    if hparams.get("_class_path"):
        return str(hparams["_class_path"]).rsplit(".", 1)[-1]
    keys = ckpt.get("state_dict") or {}
    if "head.score.weight" in keys or str(hparams.get("backbone", "")).startswith("hf_classifier:"):
        return "RewardModelModule"
    if "tokenizer_fingerprint" in ckpt or any(k.startswith("model.") for k in keys):
        return "PolicyRLModule" if "algorithm" in hparams else "PolicySFTModule"
    return None


def check_kind(ckpt: dict, path: str, flag: str, expected: Iterable[str]) -> None:
    """Refuse a checkpoint written by another module class than `expected` (class names)."""
    expected = tuple(expected)
    found = checkpoint_class(ckpt)
    if found not in expected:
        what = f"a {found} checkpoint" if found else "not a checkpoint of this codebase's modules"
        raise CheckpointError(f"{flag} {path!r}: this is {what}, expected a {'/'.join(expected)} checkpoint")


def load_checked(path: str, flag: str, expected: Iterable[str]) -> dict[str, Any]:
    """`torch.load` on CPU after `verify_archive`, then `check_kind` and `check_finite` on its state_dict.

    Args:
        path: the checkpoint file.
        flag: the option that named it, for the messages.
        expected: the module class names whose checkpoints are accepted.
    """
    verify_archive(path, flag)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)  # tensors read as used
    except (RuntimeError, pickle.UnpicklingError, EOFError, AttributeError, ModuleNotFoundError) as err:
        raise CheckpointError(f"{flag} {path!r} does not load: {type(err).__name__}: {str(err)[:300]}") from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{flag} {path!r} holds no state_dict: not a Lightning checkpoint")
    check_kind(ckpt, path, flag, expected)
    check_finite(ckpt["state_dict"], path, flag)
    return ckpt
