"""Checks of a checkpoint file before its weights are used: intact, loadable, of the expected kind, finite.

A torch checkpoint is a zip archive whose members (the pickle and one member per tensor storage) carry a CRC-32;
`torch.load` never verifies it, so bytes overwritten in place (a bad disk, a partial copy over an old file) load as
other weights without a word. `verify_archive` recomputes every CRC (about 0.04 s per 100 MB from the page cache)
and names the first bad member and the tensor it holds. `first_nonfinite` finds a NaN / inf weight, which would
otherwise train (or label) silently into NaN margins.

Used by the teacher's loading (`datamodules/preference/weak_labels.py`), the policies' `--model.init_checkpoint`
(`policy/base.py`), `--ckpt_path` (`cli.py`, and `checkpoint_io.AtomicCheckpointIO.load_checkpoint`).
"""
from __future__ import annotations

import os
import pickle
import zipfile
from typing import Any, Iterable, Optional

import torch

POLICY_CLASSES = ("PolicySFTModule", "PolicyRLModule")
REWARD_CLASSES = ("RewardModelModule",)

# (path, size, mtime_ns) of archives verified in this process: `--ckpt_path` is checked when parsed and again when
# the trainer loads it; an unchanged file is read once.
_VERIFIED: set[tuple[str, int, int]] = set()


class CheckpointError(ValueError):
    """A checkpoint file that must not be used; the message names the flag, the file and what is wrong."""


def verify_archive(path: str, flag: str) -> None:
    """Refuse a file that is not a complete torch zip archive or whose members fail their CRC-32.

    Args:
        path: the checkpoint file.
        flag: the option that named it (for the message), e.g. "--model.init_checkpoint".
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"{flag} {path!r} does not exist")
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError) as err:  # a truncated file has no central directory
        raise CheckpointError(f"{flag} {path!r} is truncated or not a torch checkpoint ({st.st_size} bytes; "
                              f"{type(err).__name__}: {err}); an interrupted save or copy? Use an intact checkpoint."
                              ) from None
    if bad is not None:
        tensor = _tensor_of_member(path, bad)
        raise CheckpointError(f"{flag} {path!r} is corrupt: member {bad!r}{f' (tensor {tensor})' if tensor else ''} "
                              "fails its CRC-32 check (the bytes on disk differ from those written); "
                              "use an intact copy")
    _VERIFIED.add(key)


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


class _StorageKey(str):
    """A storage's member name, standing in for the tensor while `_tensor_of_member` reads the pickle."""


class _KeyUnpickler(pickle.Unpickler):
    """Unpickles `data.pkl` with every tensor replaced by its storage key (no tensor data is read)."""

    def persistent_load(self, pid):
        return _StorageKey(pid[2])  # ("storage", storage_type, key, location, numel)

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name.startswith("_rebuild_"):
            return lambda first, *args, **kwargs: first if isinstance(first, _StorageKey) else None
        return super().find_class(module, name)


def _tensor_of_member(path: str, member: str) -> Optional[str]:
    """'state_dict[NAME]' for the tensor stored in `member` ("<archive>/data/<key>"), when the pickle tells."""
    try:
        with zipfile.ZipFile(path) as archive:
            pkl = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            obj = _KeyUnpickler(archive.open(pkl)).load()
    except Exception:  # noqa: BLE001 -- only an aid to the message: the member name alone is still reported
        return None
    key = member.rsplit("/", 1)[-1]
    for section in ("state_dict", *obj.keys()) if isinstance(obj, dict) else ():
        found = _find_key(obj.get(section), key, section)
        if found:
            return found
    return None


def _find_key(tree: Any, key: str, prefix: str) -> Optional[str]:
    if isinstance(tree, _StorageKey):
        return prefix if tree == key else None
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for name, value in items:
        found = _find_key(value, key, f"{prefix}[{name!r}]" if prefix else str(name))
        if found:
            return found
    return None
