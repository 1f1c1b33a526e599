"""The files of a protocol run: who may write them (global rank 0) and the lock that keeps a second run off an
out_dir; atomic writes are `datamodules.atomic_files`.

Under `--trainer.strategy ddp` Lightning re-executes the whole command line in one child process per extra
device, so every rank runs the protocol's orchestration (every rank must train and test). Only global rank 0
writes files or prints; every write replaces its target in one step (temporary file + `os.replace`), so a
crash never leaves a half-written file that a later run would take for a finished one.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import warnings


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

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, ".lock")
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
                    f"{os.path.dirname(self.path)} is in use by another protocol run (PID {holder.get('pid', '?')} "
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
