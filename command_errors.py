"""A command's failure as the one line a person reads: `error: <what, where, how to fix>`, exit code non-zero.

Every command of the project (`python cli.py ...`, each `python -m protocols.* / datamodules.* / lightning_modules.*`
entry point) runs its `main(argv)` through `run_command`. The project's refusals are ordinary exceptions whose
messages name the flag, file, line or stage and the way out; printed as a traceback that sentence would sit under
forty lines of frames. Here it is printed alone, on one line of stderr; the traceback is shown with `--traceback`
anywhere on the command line (or `SHIFTGEN_TRACEBACK=1` in the environment; `--debug`, the protocols' older
flag, still works) and is appended to the run's own log when the command names one (`log_of`).

Exit codes: 0 done; 2 refused (a bad flag, file or state: the message says which); 3 an internal error (a defect:
its type and message, and how to see the traceback); 130 interrupted by Ctrl-C; 143 stopped by SIGTERM -- Lightning
turns SIGTERM into a `SystemExit` without a code (`SIGTERMException`), which Python would end with exit code 0, so a
scheduler's `afterok` would run on a run that never finished.

This module imports nothing of the project (the ground floor of the import direction): cli.py, the protocols and
the data layer's own commands all use it.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import traceback
from typing import Any, Callable, Iterator, Optional

TRACEBACK_FLAG = "--traceback"
TRACEBACK_FLAGS = (TRACEBACK_FLAG, "--debug")  # --debug: what the protocols called it first
TRACEBACK_ENV = "SHIFTGEN_TRACEBACK"
HINT = f"rerun with {TRACEBACK_FLAG} for the traceback"

EXIT_REFUSED, EXIT_INTERNAL, EXIT_CTRL_C, EXIT_SIGTERM = 2, 3, 130, 143
# What a refusal raises: a bad flag, file or value (ValueError -- the data layer's DataError and the checkpoint
# checks are ValueErrors --, OSError, KeyError, a parser's ArgumentError), a state of a run folder or a job
# (RuntimeError: locks, unfinished stages, stale sets, SLURM answering no), a wait that ran out, and a missing
# optional package (ImportError, whose message carries the install line).
REFUSALS = (ValueError, RuntimeError, OSError, KeyError, TimeoutError, ImportError, argparse.ArgumentError)
MAX_CHARS = 2000  # a message longer than this (a dumped config, a list of every key) is cut, with a note


class UsageError(ValueError):
    """A command line that an argparse parser refused (its usage text is not printed: `parser_errors_raise`)."""


_RAISING = [0]  # > 0 while a command runs under run_command


def parsers_raise() -> bool:
    """Whether a parser's error should raise rather than print usage text and exit (inside run_command)."""
    return _RAISING[0] > 0


@contextlib.contextmanager
def parser_errors_raise() -> Iterator[None]:
    """Within the block an argument parser's error raises (one line is printed for it) instead of printing the
    usage text, which for a LightningCLI runs to fifty lines, and exiting: stdlib argparse parsers raise
    `UsageError` ("PROG: MESSAGE"), jsonargparse parsers the `ArgumentError` they raise with exit_on_error=False."""
    std = argparse.ArgumentParser.error
    jsonargparse = sys.modules.get("jsonargparse")
    nested = getattr(getattr(jsonargparse, "ArgumentParser", None), "error", None)

    def std_error(parser, message):
        guess = closest_option(message, list(parser._option_string_actions))
        raise UsageError(f"{parser.prog}: {message}{guess} ({parser.prog} --help lists the arguments)")

    def nested_error(parser, message, ex=None):
        saved, parser.exit_on_error = parser.exit_on_error, False
        if saved and not message.startswith("unknown key '"):  # a command's own parser (cli.py's says it already)
            message += closest_option(message, [a.dest for a in parser._actions])
        try:
            return nested(parser, message, ex)
        finally:
            parser.exit_on_error = saved

    argparse.ArgumentParser.error = std_error
    if nested is not None:
        jsonargparse.ArgumentParser.error = nested_error
    _RAISING[0] += 1
    try:
        yield
    finally:
        _RAISING[0] -= 1
        argparse.ArgumentParser.error = std
        if nested is not None:
            jsonargparse.ArgumentParser.error = nested


def closest_option(message: str, valid: list[str]) -> str:
    """' — did you mean X?' for the unknown option a parser's message names ("unrecognized arguments: --x",
    jsonargparse's "Option 'x' is not accepted"), or ''."""
    unknown = re.search(r"unrecognized arguments: (--?[^\s=]+)|Option '([^']+)' is not accepted", message)
    if not unknown:
        return ""
    name = unknown[1] or unknown[2]
    close = difflib.get_close_matches(name, [v for v in valid if v not in ("help", "-h", "--help")], n=1)
    return f" — did you mean '{close[0]}'?" if close else ""


def without_parser_dump(text: str) -> str:
    """A message cut before jsonargparse's nested detail ('Parser key "model": Does not validate against any of the
    Union subtypes ...') when a line of its own, naming the key, comes first (cli_guards puts one there)."""
    lines = str(text).splitlines()
    for i, line in enumerate(lines[1:], start=1):
        if line.lstrip().startswith('Parser key "'):
            return "\n".join(lines[:i])
    return str(text)


def split_traceback_flag(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether the traceback is wanted, argv without the flag): the flag or `SHIFTGEN_TRACEBACK` set and not 0."""
    wanted = any(a in TRACEBACK_FLAGS for a in argv) or os.environ.get(TRACEBACK_ENV, "0") not in ("", "0")
    return wanted, [a for a in argv if a not in TRACEBACK_FLAGS]


def one_line(text: str) -> str:
    """A message on one line: its lines joined ("; " after a line that ends a sentence or a list item, else " "),
    indentation and runs of spaces collapsed, cut at MAX_CHARS."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    joined = ""
    for line in lines:
        joined += ("" if not joined else " " if joined.endswith((":", ",", "(", "[")) else "; ") + line
    joined = re.sub(r"\s+", " ", joined)
    return joined if len(joined) <= MAX_CHARS else joined[:MAX_CHARS] + f" ... ({len(joined) - MAX_CHARS} more chars)"


def message_of(err: BaseException) -> str:
    """The exception's own message (a KeyError's is its repr; an ArgumentError's lead line when the parser set one);
    its type when it has none."""
    lead = getattr(err, "lead_line", None)
    if lead:
        return lead
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    return text.strip() or type(err).__name__


def is_sigterm(err: BaseException) -> bool:
    """Lightning's `SIGTERMException` (a SystemExit without a code), named without importing Lightning."""
    return any(cls.__name__ == "SIGTERMException" for cls in type(err).__mro__)


def run_command(main: Callable[[list[str]], Any], argv: Optional[list[str]] = None, *, prog: str,
                exit_code: Callable[[Any], int] = lambda _: 0, describe: Callable[[BaseException], Optional[str]]
                = lambda _: None, log_of: Callable[[BaseException], Optional[str]] = lambda _: None,
                interrupted: str = "it did not finish; rerun the command") -> int:
    """`exit_code(main(argv))`, or the exit code of its failure after one `error:` line on stderr.

    Args:
        main: the command; it gets argv without the traceback flag.
        argv: the arguments (default: sys.argv[1:]).
        prog: the command's name, said in the lines of an interrupted run and of an internal error.
        exit_code: the exit code of a finished run, from what `main` returned.
        describe: the one line for an exception the command knows better than its message (None: the message).
        log_of: the run's log file for this exception (None: there is none); the traceback is appended to it.
        interrupted: what a SIGTERM/Ctrl-C line adds (what survives, how to resume).
    """
    show, argv = split_traceback_flag(sys.argv[1:] if argv is None else list(argv))
    try:
        with parser_errors_raise():
            result = main(argv)
        return exit_code(result)
    except SystemExit as err:  # argparse's own exits (--help: 0; its errors: 2, already printed), sys.exit("...")
        if is_sigterm(err):
            return _fail(err, EXIT_SIGTERM, f"{prog} was stopped by SIGTERM (a scheduler's preemption or time "
                                            f"limit, or `kill`): {interrupted}", show, log_of)
        if isinstance(err.code, str):
            return _fail(err, EXIT_REFUSED, err.code[len("error: "):] if err.code.startswith("error: ") else err.code,
                         show, log_of)
        return 0 if err.code is None else err.code if isinstance(err.code, int) else 1
    except KeyboardInterrupt as err:
        return _fail(err, EXIT_CTRL_C, f"{prog} was interrupted (Ctrl-C): {interrupted}", show, log_of)
    except REFUSALS as err:  # a refusal may carry its own code (an interrupted protocol run: 128 + the signal)
        code = getattr(err, "exit_code", EXIT_REFUSED)
        return _fail(err, code if isinstance(code, int) and code > 0 else EXIT_REFUSED,
                     describe(err) or message_of(err), show, log_of)
    except Exception as err:  # noqa: BLE001 -- not a refusal: a defect, said as one, with the way to see it
        return _fail(err, EXIT_INTERNAL, f"internal error in {prog}: {type(err).__name__}: {message_of(err)} "
                                         f"({HINT}, and report it)", show, log_of)


def exit_with(code: int) -> None:
    """`sys.exit(code)` after flushing: what a `__main__` block ends with."""
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def _fail(err: BaseException, code: int, message: str, show: bool, log_of) -> int:
    log = None
    try:
        log = log_of(err)
        if log:
            with open(log, "a", encoding="utf-8") as f:
                f.write("".join(traceback.format_exception(err)))
    except Exception:  # noqa: BLE001 -- a log that cannot be written must not hide the error itself
        log = None
    if show:
        traceback.print_exception(err, file=sys.stderr)
    line = one_line(without_parser_dump(message))
    if log:
        line += f" (traceback: {log})"
    sys.stdout.flush()
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
    return code
