"""The files of a protocol run: who may write them (global rank 0), the lock that keeps a second run off an
out_dir, and its outputs published as one set (`publish_set`); atomic single files are `datamodules.atomic_files`.

Under `--trainer.strategy ddp` Lightning re-executes the whole command line in one child process per extra
device, so every rank runs the protocol's orchestration (every rank must train and test). Only global rank 0
writes files or prints; every write replaces its target in one step (temporary file + `os.replace`), so a
crash never leaves a half-written file that a later run would take for a finished one.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import warnings
from typing import Callable


def close_process_group() -> None:
    """End the process group Lightning's DDP left open, on every rank, once the protocol has returned.

    Lightning keeps the group alive after `fit` / `test`; left to interpreter shutdown, gloo's threads can be torn
    down out of order and abort a finished run ("terminate called without an active exception", exit -6), which
    a scheduler reads as a failed job. The barrier lets every rank finish its last collective first."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def is_global_zero() -> bool:
    """Whether this process is global rank 0, from its launcher's environment.

    Read before any process group exists: Lightning's DDP children get LOCAL_RANK >= 1 (and NODE_RANK on other
    nodes), torchrun sets RANK, SLURM sets SLURM_PROCID; a plain process has none of them.
    """
    if "RANK" in os.environ:
        return int(os.environ["RANK"]) == 0
    if "LOCAL_RANK" in os.environ or "NODE_RANK" in os.environ:
        return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0
    return int(os.environ.get("SLURM_PROCID", 0)) == 0


def read_json(path: str):
    """The file's content, or None when it does not exist (another rank may be replacing or removing it)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


class OutDirLock:
    """`<out_dir>/.lock`: one protocol run per out_dir at a time.

    The lock is a kernel file lock (`flock`) on the file, which also records the holder's PID and host. The
    kernel drops it when the holder exits in any way (crash, kill -9), so whether a lock is held needs no guess
    from a PID (which cannot be checked on another host sharing the folder); a lock file whose lock nobody holds
    is stale: its dead holder is named in a warning and the lock is taken over.
    """

    def __init__(self, out_dir: str, what: str = "protocol run"):
        self.path = os.path.join(out_dir, ".lock")
        self.what = what  # "stage": a stage's own lock, held by the run or cluster job running it
        self.fd = None

    def __enter__(self) -> "OutDirLock":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while self.fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RuntimeError(
                    f"{os.path.dirname(self.path)} is in use by another {self.what} (PID {holder.get('pid', '?')} "
                    f"on host {holder.get('host', '?')}, lock {self.path}). Wait for it to finish, or use another "
                    "--out_dir.") from None
            if not _same_file(fd, self.path):  # the holder removed the file between our open and our lock
                os.close(fd)
                continue
            stale = _read_holder(fd)
            if stale:
                warnings.warn(f"taking over the stale lock {self.path} of PID {stale.get('pid', '?')} on host "
                              f"{stale.get('host', '?')}, which is no longer running")
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
            self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        try:
            os.remove(self.path)  # removed while still locked: a waiting opener then re-checks (_same_file)
        finally:
            os.close(self.fd)
            self.fd = None


def _read_holder(fd: int) -> dict:
    raw = os.pread(fd, 4096, 0)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {"pid": "?", "host": f"unknown (unreadable lock file: {raw[:60]!r})"}


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


# ---- a run's outputs as one set -------------------------------------------------------------------------------------
RENAME_EXCHANGE = 2  # renameat2(2) flag: swap two paths in one step
_AT_FDCWD = -100


def publish_set(parent: str, name: str, write: Callable[[str], None], links: dict[str, str] = {}) -> str:
    """Write a run's outputs as one set: `write(folder)` fills a fresh folder, which then replaces `<parent>/<name>`
    in one step, so a reader or a rerun sees the old set or the new one, never a mix (a killed writer leaves the old
    set and an orphan that the next publish removes). `links`: stable names in `parent` (e.g. "results.md") that
    point into the set (e.g. "results/results.md"), made once. Callers hold the run's lock; returns the set's path.

    The swap is Linux's renameat2(RENAME_EXCHANGE); where a file system lacks it, the old set is renamed aside and
    the new one renamed in (a killed run in between leaves no set, never a mix; the next publish restores it).
    """
    final = os.path.join(parent, name)
    os.makedirs(parent, exist_ok=True)
    _recover(parent, name)
    staging = os.path.join(parent, f".{name}.new-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with _quiet_writer_threads():
            os.makedirs(staging)
            write(staging)
            _sync_tree(staging)
        if os.path.isdir(final) and not os.path.islink(final):
            if _exchange(staging, final):
                shutil.rmtree(staging)  # now holds the old set
            else:
                aside = os.path.join(parent, f".{name}.old-{socket.gethostname()}-{os.getpid()}")
                os.rename(final, aside)
                os.rename(staging, final)
                shutil.rmtree(aside)
        else:
            if os.path.lexists(final):
                os.remove(final)
            os.rename(staging, final)
    except OSError as err:
        raise PublishError(final, err) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for link, target in links.items():
        _link(os.path.join(parent, link), target)
    return final


class PublishError(OSError):
    """A set that could not be published (a full disk, a quota, permissions): one line naming the set, the file
    being written and what became of the old set; `errno` is the original one."""

    def __init__(self, final: str, err: OSError):
        import errno

        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
        reason = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}.get(
            err.errno) or err.strerror or str(err)
        inner = getattr(err, "path", None) or err.filename
        super().__init__(err.errno, f"cannot publish {final}: {reason}" + (f" (writing {inner})" if inner else "")
                         + "; the set published before is kept as it was and the half-written one removed"
                         + ("; free space there and rerun (finished stages are reused)" if full else ""))

    def __str__(self) -> str:
        return self.strerror


class _quiet_writer_threads:
    """While a set is written: a writer thread's OSError (TensorBoard's event writer on a full disk) is not printed
    as a thread traceback; the writer raises it again in this thread at its next write or close, where it ends
    the publish with one line (`PublishError`). Other exceptions print as before."""

    def __enter__(self):
        import threading

        self.previous = threading.excepthook

        def hook(args):
            if not issubclass(args.exc_type, OSError):
                self.previous(args)
        threading.excepthook = hook
        return self

    def __exit__(self, *exc) -> None:
        import threading

        threading.excepthook = self.previous


def _recover(parent: str, name: str) -> None:
    """Orphans of a killed publish (callers hold the lock, so no publish is running): a half-written new set is
    removed; an old set renamed aside is restored when no set stands in its place, else removed."""
    for entry in sorted(os.listdir(parent)):
        path = os.path.join(parent, entry)
        if entry.startswith(f".{name}.new-"):
            shutil.rmtree(path, ignore_errors=True)
        elif entry.startswith(f".{name}.old-"):
            if os.path.isdir(os.path.join(parent, name)):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.rename(path, os.path.join(parent, name))


def _exchange(a: str, b: str) -> bool:
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, a.encode(), _AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def _sync_tree(folder: str) -> None:
    """Flush the set's files before it is swapped in: after a power loss the swap never points at empty files."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _link(path: str, target: str) -> None:
    """`path` -> `target` (relative), replacing an older plain file or folder of that name in one step where possible."""
    if os.path.islink(path) and os.readlink(path) == target:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)  # an older layout's real folder (figures/): replaced by the link below
    tmp = f"{path}.link-{os.getpid()}"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)
