"""A record of slow runs: every test marked `slow` that ran appends one row to docs/slow_runs.md (registered from
tests/conftest.py, so `make test-slow` and any `pytest -m slow ...` write it).

A row says when (UTC), on which commit (`+dirty` when tracked files other than the record differ from it), which test,
how it ended, its wall time (setup + call) and the machine (protocols.engine.machine). Each row is one `write` to a
file opened with O_APPEND, the moment its test ends: a run killed after hours keeps every row written before.

`SHIFTGEN_SLOW_RECORD=0` turns the record off; `SHIFTGEN_SLOW_RECORD_FILE` writes it elsewhere (the plugin's tests).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from typing import Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join("docs", "slow_runs.md")

HEADER = """# Record of slow runs

Every test marked `slow` (the end-to-end reproductions of the documented tables) that runs appends one row here:
`make test-slow`, or any `pytest -m slow ...`, writes it (tests/slow_record.py), one row per test as it ends, so a
run stopped part-way keeps the rows of the tests it finished. Date and time are UTC; the commit is `+dirty` when
tracked files differed from it; wall s is the test's setup and call; the machine and its fingerprint id are
protocols/engine/machine.py's (a rerun can match a table cell for cell only on the same fingerprint). Commit the new
rows with the change they checked.

| date (UTC) | commit | test | outcome | wall s | machine | fingerprint |
|---|---|---|---|---|---|---|
"""

_pending: dict[str, dict] = {}  # node id -> {"seconds", "outcome"} until its teardown
_context: dict = {}  # commit and machine, read once per session at the first slow test


def record_path() -> Optional[str]:
    """Where rows go, or None when the record is off."""
    if os.environ.get("SHIFTGEN_SLOW_RECORD", "1") == "0":
        return None
    return os.environ.get("SHIFTGEN_SLOW_RECORD_FILE") or os.path.join(ROOT, RECORD)


def git_commit(root: str = ROOT) -> str:
    """Short commit, `+dirty` if a tracked file (the record itself excepted: its new rows are not code) differs."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", f":!{RECORD}")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def machine() -> dict:
    """The fingerprint of a fresh Python process, not of this one: tests/conftest.py sets one torch thread here, while
    the protocols a slow test starts as subprocesses run with the machine's default (or OMP_NUM_THREADS)."""
    code = "import json; from protocols.engine.machine import fingerprint; print(json.dumps(fingerprint()))"
    try:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                             env=dict(os.environ, PYTHONPATH=ROOT), timeout=120).stdout
        return json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        from protocols.engine.machine import fingerprint

        return fingerprint()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def format_row(when: datetime, commit: str, nodeid: str, outcome: str, seconds: float, fp: dict) -> str:
    from protocols.engine.machine import describe

    cells = [when.strftime("%Y-%m-%d %H:%M:%S"), commit, f"`{nodeid}`", outcome, f"{seconds:.1f}", describe(fp),
             fp.get("id", "")]
    return "| " + " | ".join(_cell(c) for c in cells) + " |\n"


def append_row(path: str, row: str) -> None:
    """One write with O_APPEND (a new file gets the header in the same write)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        text = (HEADER if os.fstat(fd).st_size == 0 else "") + row
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    reason = reason.removeprefix("Skipped: ")
    return f"skipped: {reason[:200]}" if reason else "skipped"


def outcome_of(report) -> Optional[str]:
    """What a phase's report adds to the row's outcome; None: nothing (a passing setup or teardown)."""
    if report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else _skip_reason(report)
    if report.failed:
        return "failed" if report.when == "call" else f"error ({report.when})"
    if report.when == "call":
        return "xpassed" if hasattr(report, "wasxfail") else "passed"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    path = record_path()
    if path is not None and item.get_closest_marker("slow") is not None:
        _note(item.nodeid, report, path)
    return report


def _note(nodeid: str, report, path: str) -> None:
    if not _context:  # before the first slow test's call: the commit it runs
        _context.update(commit=git_commit(), machine=machine())
    state = _pending.setdefault(nodeid, {"seconds": 0.0, "outcome": []})
    if report.when in ("setup", "call"):
        state["seconds"] += report.duration
    said = outcome_of(report)
    if said:
        state["outcome"].append(said)
    if report.when == "teardown":
        _pending.pop(nodeid)
        row = format_row(datetime.now(timezone.utc), _context["commit"], nodeid,
                         ", ".join(state["outcome"]) or "passed", state["seconds"], _context["machine"])
        try:
            append_row(path, row)
        except OSError as err:  # the record must not turn a test run into a crash
            sys.stderr.write(f"slow-run record: could not append to {path}: {err}\n")
