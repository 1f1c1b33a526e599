"""Is a file an intact torch checkpoint? Every member's CRC-32 of its zip archive, checked without loading it.

A torch checkpoint is a zip archive whose members (the pickle and one member per tensor storage) carry a CRC-32;
`torch.load` never verifies it, so bytes overwritten in place (a bad disk, a partial copy over an old file) load as
other weights without a word. `verify_archive` recomputes every CRC (about 0.04 s per 100 MB from the page cache)
and names the first bad member and the tensor it holds (read from the pickle, no tensor data loaded).

Pure file reading, on the data floor: the data module checks `--data.teacher_checkpoint` with it when constructed.
The checks that load weights (`load_checked`: kind, finite) are `lightning_modules/checkpoint_checks.py`, which
re-exports these.
"""
from __future__ import annotations

import os
import pickle
import zipfile
from typing import Any, Optional

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
