"""A stage's child process (the mixture's `cli.py fit`) that never outlives the protocol that started it.

`kill -9` of a protocol cannot run any cleanup of its own, so the child is tied to it three ways:

- **Parent-death signal.** On Linux the child asks the kernel for SIGKILL when its parent dies
  (`prctl(PR_SET_PDEATHSIG)`, in `preexec_fn`, between fork and exec); a parent already gone by then is caught by
  comparing `getppid()`. The signal follows the *thread* that started the child: the engine's pool threads live
  until their stage's child has ended, so that is the protocol's life.
- **The stage lock.** The child inherits the descriptor of its stage's lock (`<root>/.stages/<key>/.lock`, an
  `flock`, which the kernel releases only when every descriptor of it is closed): while the child lives, a rerun
  cannot take the stage (it is refused, naming the holder) and `--status` shows it running, even where the
  parent-death signal does not exist. The lock file also names the child's PID.
- **Interruption.** A protocol stopped by SIGTERM / SIGINT kills every live child before it exits
  (`kill_all`, called by the engine's executors).
- **DDP ranks.** The ranks Lightning starts for a W2S stage under `--trainer.strategy ddp` re-run the protocol's
  command; each asks for the same parent-death signal itself (`die_with_parent`, called by `local.run_local`).

The executor says which lock a stage holds for the thread that runs it (`holding`); `run` reads it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

PR_SET_PDEATHSIG = 1

_live: set[subprocess.Popen] = set()
_guard = threading.Lock()
_local = threading.local()
_stopping = False  # set by `kill_all`: a stage thread that reaches `run` afterwards starts no child


@contextmanager
def holding(lock) -> Iterator[None]:
    """Within the block, children started by this thread inherit `lock` (a held `run_files.OutDirLock`)."""
    previous = getattr(_local, "lock", None)
    _local.lock = lock
    try:
        yield
    finally:
        _local.lock = previous


def run(cmd: list[str], **kwargs) -> int:
    """`subprocess.run(cmd, **kwargs).returncode` for a child that dies with this process (see the module) and
    holds the calling thread's stage lock (`holding`) while it lives."""
    lock = getattr(_local, "lock", None)
    fd = getattr(lock, "fd", None)
    if fd is not None:
        kwargs["pass_fds"] = tuple(kwargs.get("pass_fds", ())) + (fd,)
    if sys.platform.startswith("linux"):
        kwargs["preexec_fn"] = _die_with(os.getpid())
    with _guard:  # registered before a signal could ask `kill_all` for it
        if _stopping:
            raise RuntimeError(f"not started, the protocol is stopping: {' '.join(cmd)[:200]}")
        proc = subprocess.Popen(cmd, **kwargs)
        _live.add(proc)
    try:
        if lock is not None and fd is not None:
            _name_child(lock, proc.pid)
        return proc.wait()
    except BaseException:
        proc.kill()  # this thread is unwinding: its child goes with it
        proc.wait()
        raise
    finally:
        with _guard:
            _live.discard(proc)


def kill_all() -> list[int]:
    """SIGKILL every live child (an interrupted protocol: a stage whose child was stopped has no result and runs
    again on the rerun, so there is nothing for it to save), and start no more until `allow`. Returns their PIDs."""
    global _stopping
    with _guard:
        _stopping = True
        procs = list(_live)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except OSError:
            pass
    return [p.pid for p in procs]


def allow() -> None:
    """Children may be started again (after `kill_all`, once the interrupted executor has drained)."""
    global _stopping
    with _guard:
        _stopping = False


def live() -> list[int]:
    """The PIDs of the children running now."""
    with _guard:
        return [p.pid for p in _live]


def die_with_parent() -> bool:
    """This process gets SIGKILL when its parent dies: what a DDP rank that Lightning (or torchrun) started calls,
    so that a protocol killed with `kill -9` leaves no rank waiting in a collective for the group's 30-minute
    timeout. Returns whether the request was made (Linux only)."""
    parent = os.getppid()
    preexec = _die_with(parent) if sys.platform.startswith("linux") else None
    if preexec is None:
        return False
    preexec()
    return True


def _die_with(parent: int):
    """`preexec_fn`: SIGKILL this child when its parent dies. Bound before the fork, so the child only calls C."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request: nobody would stop this child
            os._exit(137)
    return preexec


def _name_child(lock, pid: int) -> None:
    """Add the child's PID to its stage's lock file (what `--status` and a refused rerun name)."""
    try:
        raw = os.pread(lock.fd, 4096, 0)
        holder = json.loads(raw) if raw else {}
        holder["child"] = pid
        os.ftruncate(lock.fd, 0)
        os.pwrite(lock.fd, json.dumps(holder).encode(), 0)
    except (OSError, ValueError):
        pass  # a record for people: the lock itself is what keeps a second fit off the stage
