"""The record of slow runs (tests/slow_record.py): a pytest run of a generated file whose tests are marked slow writes
one row per test, with its outcome and id, into the file SHIFTGEN_SLOW_RECORD_FILE names."""
import os
import subprocess
import sys
from datetime import datetime, timezone

from tests.slow_record import HEADER, ROOT, append_row, format_row, git_commit

TESTS = '''
import time

import pytest

pytestmark = pytest.mark.slow


def test_passes():
    time.sleep(0.3)


def test_fails():
    assert 1 + 1 == 3


@pytest.mark.skip(reason="no model | here")
def test_skipped():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("setup breaks")


def test_setup_error(broken):
    pass
'''

FAST = '''
def test_not_slow():
    pass
'''


def _run(tmp_path, record, **env):
    (tmp_path / "test_generated.py").write_text(TESTS)
    (tmp_path / "test_fast.py").write_text(FAST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    env = dict(os.environ, PYTHONPATH=ROOT, SHIFTGEN_SLOW_RECORD_FILE=str(record), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.slow_record", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)


def _rows(record):
    text = record.read_text()
    assert text.startswith(HEADER)  # a new file gets the header, in the same write as its first row
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text[len(HEADER):].splitlines()]


def test_each_slow_test_appends_its_row(tmp_path):
    record = tmp_path / "out" / "slow_runs.md"
    proc = _run(tmp_path, record)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one failure, one error
    rows = _rows(record)
    by_test = {r[2]: r for r in rows}
    assert set(by_test) == {"`test_generated.py::test_passes`", "`test_generated.py::test_fails`",
                            "`test_generated.py::test_skipped`", "`test_generated.py::test_setup_error`"}  # not the fast one
    assert by_test["`test_generated.py::test_passes`"][3] == "passed"
    assert by_test["`test_generated.py::test_fails`"][3] == "failed"
    assert by_test["`test_generated.py::test_skipped`"][3] == "skipped: no model \\| here"  # the cell's pipe escaped
    assert by_test["`test_generated.py::test_setup_error`"][3] == "error (setup)"
    assert float(by_test["`test_generated.py::test_passes`"][4]) >= 0.3  # its sleep, setup + call
    for row in rows:
        assert len(row) == 7
        datetime.strptime(row[0], "%Y-%m-%d %H:%M:%S")
        # the repository's commit, though the run's folder is elsewhere (+dirty may flip while others edit the tree)
        assert row[1].removesuffix("+dirty") == git_commit().removesuffix("+dirty")
        assert len(row[6]) == 12 and row[5].count(", ") >= 4


def test_a_second_run_appends_below_the_first(tmp_path):
    record = tmp_path / "slow_runs.md"
    record.write_text(HEADER + "| earlier row |\n")
    _run(tmp_path, record)
    rows = _rows(record)
    assert rows[0] == ["earlier row"] and len(rows) == 5


def test_the_record_can_be_turned_off(tmp_path):
    record = tmp_path / "slow_runs.md"
    proc = _run(tmp_path, record, SHIFTGEN_SLOW_RECORD="0")
    assert proc.returncode == 1 and not record.exists()


def test_a_row_from_literal_values(tmp_path):
    fp = {"cpu": "AMD EPYC", "flags": ["avx2", "fma"], "threads": 2, "torch": "2.3.1", "transformers": "4.44.0",
          "id": "0123456789ab"}
    row = format_row(datetime(2026, 12, 8, 9, 5, 7, tzinfo=timezone.utc), "abc1234+dirty",
                     "tests/test_w2s_slow.py::test_make_demo_reproduces_the_documented_table", "passed", 301.26, fp)
    assert row == ("| 2026-12-08 09:05:07 | abc1234+dirty | `tests/test_w2s_slow.py::test_make_demo_reproduces_the_"
                   "documented_table` | passed | 301.3 | AMD EPYC, avx2+fma, 2 threads, torch 2.3.1, transformers 4.44.0"
                   " | 0123456789ab |\n")
    path = tmp_path / "r.md"
    append_row(str(path), row)
    append_row(str(path), row)
    assert path.read_text() == HEADER + row + row


def test_the_committed_record_opens_with_the_header():
    with open(os.path.join(ROOT, "docs", "slow_runs.md"), encoding="utf-8") as f:
        assert f.read().startswith(HEADER)


def test_dirty_means_a_tracked_file_other_than_the_record(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "slow_runs.md").write_text(HEADER)
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "one")
    short = git("rev-parse", "--short", "HEAD")
    (tmp_path / "untracked.txt").write_text("new")
    assert git_commit(str(tmp_path)) == short  # untracked files do not count
    (tmp_path / "docs" / "slow_runs.md").write_text(HEADER + "| a row |\n")
    assert git_commit(str(tmp_path)) == short  # the record's own new rows do not count
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(str(tmp_path)) == short + "+dirty"
    assert git_commit(str(tmp_path / "no_repo_here")) == "unknown"
