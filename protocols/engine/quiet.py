"""A stage's own output to its log file instead of the terminal (protocol runs print one progress line per stage;
`--verbose` brings the stages' output back).

The redirection is of the process's file descriptors 1 and 2 (Lightning's loggers, the `datasets` progress bars and
warnings hold their own references to the streams, and C extensions write to the descriptors) and of `sys.stdout` /
`sys.stderr` (for what looks them up when it writes, where they are not the descriptors: under pytest). The file is opened for appending, so under DDP every rank, each running the same stage, writes into it.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator, Optional


@contextmanager
def output_to(path: Optional[str]) -> Iterator[None]:
    """Within the block, descriptors 1 and 2 write to `path` (appended); None: nothing changes."""
    if path is None:
        yield
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    streams = sys.stdout, sys.stderr
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout = sys.stderr = log  # what writes to sys.stdout itself (rich, print) when it is not fd 1 (pytest)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
        log.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
