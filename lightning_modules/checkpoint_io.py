"""`AtomicCheckpointIO`: checkpoint files that are complete or absent, never half-written under their final name.

Lightning's `TorchCheckpointIO` saves through an fsspec transaction that writes a temporary file in the system temp
directory and moves it into place on commit. When that directory is on another file system (TMPDIR on a tmpfs, a
node-local /tmp and a network checkpoint folder) the move is a copy: a SIGKILL or a full disk during it leaves a
truncated `epoch0-step2-acc1.0000.ckpt` or `last.ckpt` under its final name, which a resume then reads.

Here the temporary file is a sibling of the target (`datamodules.atomic_files.temp_path`: `<name>.tmp-<host>-<pid>`),
flushed and fsynced before one `os.replace`, so the rename never crosses a file system. A failed write removes
the temporary file and raises a `WriteError` (an OSError) naming the path (ENOSPC included); the previous file at that path is
untouched. A killed writer's temporary file is removed by the next save into that directory (`remove_orphans`).
Loading checks every archive member's CRC-32 and the weights' finiteness (`checkpoint_checks`), so a truncated or
corrupt file is an error naming it rather than a raw zip-reader message.

`cli.ShiftCLI` installs it in every Trainer it builds (in place of the default `TorchCheckpointIO`). Under DDP the
strategy calls `save_checkpoint` on global rank 0 only, as for the default plugin.
"""
from __future__ import annotations

import os
import pickle
from typing import Any, Callable, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH

from datamodules.atomic_files import WriteError, remove_orphans, remove_path, temp_path
from lightning_modules.checkpoint_checks import CheckpointError, check_finite, verify_archive


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` with same-directory temporary files, fsync and `os.replace` (see the module docstring).

    Args:
        chosen_by: what chose the checkpoint directory, named when a save fails (e.g. "--trainer.default_root_dir").
        flag: the option named when a checkpoint fails its checks at load.
    """

    def __init__(self, chosen_by: Optional[str] = None, flag: str = "--ckpt_path"):
        self.chosen_by = chosen_by
        self.flag = flag

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Optional[Any] = None) -> None:
        if not _is_local_file_protocol(path):  # object stores have their own atomic uploads
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint does not take storage_options")
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        tmp = temp_path(path)
        try:
            os.makedirs(directory, exist_ok=True)
            remove_orphans(directory)
            with open(tmp, "wb") as f:
                self.write(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())  # the data is on disk before the name points at it
            os.replace(tmp, path)
            _fsync_directory(directory)  # ... and the new name survives a power loss
        except BaseException as err:  # KeyboardInterrupt too: no temp file of a live (or exiting) process stays
            remove_path(tmp)
            cause = _os_error(err)
            if cause is not None and not isinstance(err, WriteError):
                raise WriteError(path, cause, self.chosen_by) from err
            raise

    def write(self, checkpoint: dict[str, Any], f) -> None:
        """Serialise `checkpoint` into the open temporary file `f` (the one place that writes checkpoint bytes)."""
        torch.save(checkpoint, f)

    def load_checkpoint(self, path: _PATH, map_location: Optional[Callable] = lambda storage, loc: storage,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        if not _is_local_file_protocol(path):
            return super().load_checkpoint(path, map_location, weights_only)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{self.flag} {path!r}: checkpoint file not found")
        verify_archive(path, self.flag)
        try:
            checkpoint = super().load_checkpoint(path, map_location, weights_only)
        except (RuntimeError, pickle.UnpicklingError, EOFError) as err:
            raise CheckpointError(f"{self.flag} {path!r} does not load: {type(err).__name__}: {str(err)[:300]}") from err
        check_finite(checkpoint.get("state_dict") or {}, path, self.flag)
        return checkpoint


def _os_error(err: BaseException) -> Optional[OSError]:
    """The OSError behind `err`: torch's zip writer reports a failed write (ENOSPC) as a RuntimeError of its own,
    raised while closing the archive, with the OSError as its context."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some file systems do not open directories; the rename itself has happened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def install_atomic_checkpoint_io(trainer, chosen_by: Optional[str] = None) -> bool:
    """Give `trainer` an `AtomicCheckpointIO` where it would use Lightning's default `TorchCheckpointIO`, also as the
    base of a wrapping plugin (`AsyncCheckpointIO`) that has no base of its own; a plugin the user chose (a cloud
    one, a subclass, ...) is kept. Returns whether it was installed."""
    from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

    strategy = trainer.strategy
    current = getattr(strategy, "_checkpoint_io", None)
    if isinstance(current, _WrappingCheckpointIO):  # its base is filled with the default on first use
        if current.checkpoint_io is not None and type(current.checkpoint_io) is not TorchCheckpointIO:
            return False
        current._checkpoint_io = AtomicCheckpointIO(chosen_by)
        current._base_checkpoint_io_configured = True
        return True
    if current is not None and type(current) is not TorchCheckpointIO:
        return False
    strategy.checkpoint_io = AtomicCheckpointIO(chosen_by)
    return True
