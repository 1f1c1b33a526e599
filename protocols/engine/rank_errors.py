"""Rank-0-only work whose failure ends every rank at once, not after the process-group timeout.

Under `--trainer.strategy ddp` every rank runs a protocol's orchestration and only global rank 0 writes files
(`run_files.is_global_zero`). If such a write raises (disk full, permission), rank 0 dies while the others go on
into the next stage's fit and block in its first collective until the process group times out (30 min). A section
makes the ranks agree on its outcome right after it: every rank enters it, rank 0 runs the work, then one
`all_gather_object` tells every rank whether any rank failed. Rank 0 re-raises its own exception; the others raise
a `RankZeroSectionError` that names the section and rank 0's exception type and message.

The agreement needs a process group: Lightning creates one in a stage's first fit and keeps it afterwards, so
every rank-0-only step after the first fit is covered (result files, the next stage's directory clearing, the
published results). With no process group (one process, or rank 0 before any fit) the section simply runs the work
on rank 0 and lets its exception propagate. The wait itself is bounded by the group's timeout only while rank 0
is alive and busy; a failure is answered as soon as rank 0 reaches the collective.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch.distributed as dist

from protocols.engine.run_files import is_global_zero


class RankZeroSectionError(RuntimeError):
    """Raised on the ranks that did not fail when another rank failed inside a section."""


def _group_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def rank_zero_section(name: str) -> Iterator[bool]:
    """Every rank enters; the body does its rank-0-only work under the yielded flag; on leaving, the ranks agree.

    Example::

        with rank_zero_section(f"write result.json of {key}") as rank_zero:
            if rank_zero:
                atomic_write_json(result, path)

    Args:
        name: what the section does, for the error the other ranks raise
            ("rank 0 failed in 'write result.json of seed0/naive': OSError: ...").

    Yields:
        Whether this process is global rank 0 (the process group's rank when one is initialised, else the
        launcher's environment).

    Raises:
        RankZeroSectionError: on a rank whose own body succeeded, when another rank's body raised.
    """
    if not _group_active():  # one process, or before any fit: nobody to tell
        yield is_global_zero()
        return
    rank = dist.get_rank()
    try:
        yield rank == 0
    except BaseException as exc:
        try:
            _agree(name, f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - the peers are gone or failing too: this rank's own error is the one to show
            pass
        raise
    _agree(name, None)


def _agree(name: str, failure: Optional[str]) -> None:
    """One collective on every rank: raise on this (succeeded) rank when another rank's section failed."""
    outcomes: list[Optional[str]] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, failure)
    if failure is not None:
        return  # the caller re-raises its own exception
    failed = [(r, f) for r, f in enumerate(outcomes) if f is not None]
    if failed:
        rank, message = failed[0]
        raise RankZeroSectionError(f"rank {rank} failed in {name!r}: {message}")


def on_rank_zero(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on global rank 0 inside a `rank_zero_section(name)`; every rank must call it.

    Args:
        name: what the call does, for the error the other ranks raise.
        fn: the rank-0-only work (a file write, a publication).
        *args: positional arguments of `fn`.
        **kwargs: keyword arguments of `fn`.

    Returns:
        `fn`'s result on rank 0, None on the other ranks.
    """
    with rank_zero_section(name) as rank_zero:
        return fn(*args, **kwargs) if rank_zero else None
