"""A protocol command's refusal as one line a person reads first: `error: <what, where, how to fix>`, exit code 2.

The protocols raise ordinary exceptions whose messages name the flag, file or stage and the way out; printed as a
traceback, that sentence sits on the last of forty lines. `run_main` is what each protocol module runs under
`python -m`: it prints the message alone (`--debug` anywhere on the command line shows the traceback instead) and
exits non-zero. Library callers (tests, `protocols.grid`) call `main()` itself and get the exception.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, NoReturn, Optional

from protocols.run_files import close_process_group

DEBUG_FLAG = "--debug"
# What a refusal raises: a bad flag or file (ValueError, OSError, KeyError), a state of the run folder
# (RuntimeError: locks, unfinished stages, stale sets), SLURM answering no (RuntimeError), a wait that ran out.
REFUSALS = (ValueError, RuntimeError, OSError, KeyError, TimeoutError)


def run_main(main: Callable[[Optional[list[str]]], Any], exit_code: Callable[[Any], int] = lambda _: 0) -> NoReturn:
    """`sys.exit(exit_code(main(argv)))`, where a refusal prints one `error:` line (the traceback with --debug)."""
    argv = sys.argv[1:]
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    try:
        result = main(argv)
    except SystemExit:
        raise
    except REFUSALS as err:
        if debug:
            raise
        sys.stderr.write(f"error: {message_of(err)}\n({DEBUG_FLAG} shows the traceback)\n")
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 -- not a refusal: a defect, said as one, with the way to see it
        if debug:
            raise
        sys.stderr.write(f"error: internal error {type(err).__name__}: {message_of(err)}\n(a defect: rerun with "
                         f"{DEBUG_FLAG} for the traceback and report it)\n")
        sys.exit(3)
    close_process_group()  # a finished DDP run exits 0 on every rank (see its docstring)
    sys.exit(exit_code(result))


def message_of(err: BaseException) -> str:
    """The exception's own message (a KeyError's is its repr); its type when it has none."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    return text.strip() or type(err).__name__
