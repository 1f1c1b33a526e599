"""Files replaced in one step (temporary file + `os.replace`): a crash or a concurrent reader never sees a
half-written cache, label set, result or table. Shared by the data caches, the reward model's test results and
the protocols.

Temporary names carry their owner, `<path>.tmp-<host>-<pid>` (`temp_path`), so that a later writer can tell the
leftovers of a killed process from the work of a live one: `remove_orphans(directory)` deletes the temporary
entries of this host whose process is gone and nothing else (a SIGKILL runs no `finally`, and a killed data
preparation used to leave ~46 MB behind per kill). A failed write (a full disk, a quota) raises `WriteError`,
which names the path and, where given, the flag or variable that chose its directory.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
from typing import Optional, Union

# Host names may hold "-" and "."; the pid is the last run of digits, so the greedy host group stays unambiguous.
_TEMP_NAME = re.compile(r"\.tmp-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>\d+)$")
_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}


class WriteError(OSError):
    """A write that failed, naming the path and what chose its directory; `errno` is the original one (ENOSPC,
    EDQUOT, ...), so `except OSError` and errno checks keep working."""

    def __init__(self, path: str, err: OSError, chosen_by: Optional[str] = None):
        reason = _FULL.get(err.errno) or (err.strerror or str(err))
        where = f"; the directory was chosen by {chosen_by}" if chosen_by else ""
        hint = " -- free space there or point it at another disk" if err.errno in _FULL and chosen_by else ""
        detail = f" (at {err.filename})" if getattr(err, "filename", None) and err.filename != path else ""
        super().__init__(err.errno, f"cannot write {path}: {reason}{detail}{where}{hint}")
        self.path, self.original, self.chosen_by = path, err, chosen_by

    def __str__(self) -> str:
        return self.strerror


@contextlib.contextmanager
def naming_write_errors(path: str, chosen_by: Optional[str] = None):
    """Turn an OSError raised inside the block (a write to `path`) into a `WriteError` naming it and `chosen_by`."""
    try:
        yield
    except WriteError as err:
        if err.chosen_by is None and chosen_by:  # an inner writer named the exact path; add what chose the directory
            raise WriteError(err.path, err.original, chosen_by) from err.original
        raise
    except OSError as err:
        raise WriteError(path, err, chosen_by) from err


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def temp_path(path: str) -> str:
    """The temporary sibling of `path` owned by this process: `<path>.tmp-<host>-<pid>` (see `remove_orphans`)."""
    return f"{path}.tmp-{_host()}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_orphans(directory: str) -> list[str]:
    """Delete the temporary files and folders (`temp_path` names) in `directory` left by dead processes of this host.

    Only entries whose host is this host and whose pid is not alive go: a live writer's temp is never touched, and
    a temp of another host (a shared file system) is left to that host, where its pid means something. A reused pid
    only keeps an orphan a while longer. Returns the removed paths; a missing directory has none.
    """
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    host, removed = _host(), []
    for name in names:
        match = _TEMP_NAME.search(name)
        if match is None or match["host"] != host or _alive(int(match["pid"])):
            continue
        full = os.path.join(directory, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            try:
                os.remove(full)
            except FileNotFoundError:  # another sweeper was first
                pass
        removed.append(full)
    return removed


def remove_path(path: str) -> None:
    """Remove a file or a folder if it exists (the cleanup of a failed temp)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def atomic_write(path: str, data: Union[str, bytes], chosen_by: Optional[str] = None) -> None:
    """Replace `path` by `data` in one step (under DDP, callers write on global rank 0 only).

    Args:
        path: the file to replace.
        data: its new content (text or bytes).
        chosen_by: the flag or variable that chose the directory (e.g. "--data.cache_dir"), named when the
            write fails; the temp file is removed then, and `path` keeps its old content.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = temp_path(path)
    try:
        with naming_write_errors(path, chosen_by):
            os.makedirs(directory, exist_ok=True)
            remove_orphans(directory)
            with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_json(payload: dict, path: str, indent: Optional[int] = 2, chosen_by: Optional[str] = None) -> None:
    atomic_write(path, json.dumps(payload, indent=indent) + "\n", chosen_by)
