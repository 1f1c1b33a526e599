"""SIGTERM and SIGINT while a protocol runs its stages: the run ends non-zero with one line naming the stage(s) it
interrupted and saying that a rerun resumes, and nothing is published.

Lightning turns a SIGTERM during `fit` into a `SystemExit` without a code (exit 0: a SLURM `afterok` dependency, or
`timeout`'s caller, would take a preempted run for a finished one), and a SIGINT into `sys.exit(1)`. So the engine
installs its own handler for both signals around its executors (`on_signals`): the first signal raises
`Interrupted` in the main thread (Lightning's composed SIGTERM handler calls it, after its own), which unwinds the
stage through Lightning's teardown; the engine turns it into `StageInterrupted`, a `RuntimeError` that the protocol
command prints as its one `error:` line. Further signals while the run unwinds are ignored (the children get
SIGKILL: `children.kill_all`), so a second Ctrl-C cannot break the cleanup.

A stage interrupted this way has no result (W2S writes `result.json` only when a stage is complete; a mixture stage
whose child was killed records a failure), so the rerun of the same command runs it again and reuses the rest.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """Raised by the engine's signal handler; a BaseException, so that no `except Exception` in a stage eats it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StageInterrupted(RuntimeError):
    """A protocol run ended by a signal: its message names the stage(s) and the way to resume; `exit_code` is the
    shell's convention for a process ended by that signal (128 + its number)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class _State:
    received: Optional[int] = None


@contextmanager
def on_signals(running: Callable[[], list[str]], what: str = "stage") -> Iterator[_State]:
    """Within the block, SIGTERM / SIGINT raise `Interrupted` in the main thread, and leaving the block by one (or by
    what Lightning makes of one: a `SystemExit`, a `KeyboardInterrupt`) raises `StageInterrupted` naming
    `running()`, the keys of the stages in progress. Outside the main thread (a library caller's worker) nothing is
    installed: Python lets only the main thread set handlers."""
    state = _State()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, frame):
        if state.received is not None:
            return  # already unwinding: a second signal must not interrupt the cleanup
        state.received = signum
        raise Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield state
    except BaseException as err:
        if state.received is None:
            raise
        raise StageInterrupted(interrupted_message(running(), state.received, what), state.received) from err
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def interrupted_message(keys: list[str], signum: int, what: str = "stage") -> str:
    """'seed0/naive was interrupted by SIGTERM before it finished; nothing was published. Rerun the same command to
    resume: ...'."""
    name = signal.Signals(signum).name
    if keys:
        which = f"{', '.join(keys)} {'was' if len(keys) == 1 else 'were'} interrupted by {name} before "
        which += "it finished" if len(keys) == 1 else "they finished"
    else:
        which = f"the run was interrupted by {name} between {what}s"
    return (f"{which}; nothing was published. Rerun the same command to resume: finished {what}s are reused, "
            f"{'the interrupted ones run' if keys else 'the rest run'} again")
