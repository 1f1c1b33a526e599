"""A protocol command's refusal as the one line a person reads: `error: <what, where, how to fix>`, exit code 2.

The protocols raise ordinary exceptions whose messages name the flag, file or stage and the way out; printed as a
traceback, that sentence sits on the last of forty lines. `run_main` is what each protocol module runs under
`python -m`: `command_errors.run_command` prints the message alone on one line (`--traceback` anywhere on the
command line, or SHIFTGEN_TRACEBACK=1, shows the traceback too; `--debug` still does; a stage's failure also
appends it to that stage's `stage.log`) and the process exits
non-zero: 2 refused, 3 an internal error (a defect), 143 stopped by SIGTERM -- Lightning's `SIGTERMException` has no
exit code, so without this a preempted or timed-out stage ended the protocol with exit code 0 (issue 49). Library
callers (tests, `protocols.w2s.grid`) call `main()` itself and get the exception.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, NoReturn, Optional

from command_errors import exit_with, run_command
from protocols.engine.run_files import close_process_group

INTERRUPTED = ("the stage that was running did not finish; rerun the same command: "
               "finished stages are reused and the interrupted one runs again")


def run_main(main: Callable[[Optional[list[str]]], Any], exit_code: Callable[[Any], int] = lambda _: 0) -> NoReturn:
    """`sys.exit(exit_code(main(argv)))`, where a failure prints one `error:` line (with its traceback on request)."""
    code = run_command(main, sys.argv[1:], prog=f"python -m {_module_name()}", exit_code=exit_code,
                       interrupted=INTERRUPTED, log_of=stage_log_of)
    if code == 0:
        close_process_group()  # a finished DDP run exits 0 on every rank (see its docstring)
    exit_with(code)


def _module_name() -> str:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)  # `python -m protocols.w2s` runs protocols.w2s.__main__
    return name.removesuffix(".__main__") if name else os.path.basename(sys.argv[0])


def stage_log_of(err: BaseException) -> Optional[str]:
    """The log of the stage that was running when `err` was raised (`<stage dir>/stage.log`, which holds that
    stage's output), found in the frames the exception passed through; None outside a stage or before its log."""
    import traceback

    for frame, _ in reversed(list(traceback.walk_tb(err.__traceback__))):
        folder = getattr(frame.f_locals.get("stage"), "dir", None)
        if isinstance(folder, str) and os.path.isfile(os.path.join(folder, "stage.log")):
            return os.path.join(folder, "stage.log")
    return None
