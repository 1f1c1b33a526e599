"""Fault injection at the protocol's results publish (issue 28, case 7): a run killed while writing its tables leaves
the old set whole (never three rows in results.json beside two in results.md), the next run removes the orphan and
publishes a set equal to a clean run's, and TensorBoard's summary holds one event file."""
import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from protocols.engine import run_files
from protocols.engine.run_files import publish_set
from protocols.w2s.protocol import main as run_protocol
from tests.test_w2s_protocol import _tiny_protocol, _write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINKS = {"a.txt": "set/a.txt", "b.txt": "set/b.txt"}


def _writer(text: str):
    def write(folder):
        for name in ("a.txt", "b.txt"):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
    return write


def _read(parent) -> tuple[str, str]:
    return tuple(open(os.path.join(parent, n)).read() for n in ("a.txt", "b.txt"))


def test_publish_set_swaps_the_whole_set_and_keeps_stable_names(tmp_path):
    parent = str(tmp_path)
    (tmp_path / "a.txt").write_text("a file of an older layout")  # replaced by a link
    publish_set(parent, "set", _writer("one"), LINKS)
    assert _read(parent) == ("one", "one") and os.readlink(tmp_path / "a.txt") == "set/a.txt"
    publish_set(parent, "set", _writer("two"), LINKS)
    assert _read(parent) == ("two", "two") and sorted(os.listdir(parent)) == ["a.txt", "b.txt", "set"]

    def half(folder):  # a writer that fails midway: the old set stays, nothing of the new one remains
        open(os.path.join(folder, "a.txt"), "w").write("three")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        publish_set(parent, "set", half, LINKS)
    assert _read(parent) == ("two", "two") and sorted(os.listdir(parent)) == ["a.txt", "b.txt", "set"]


def test_publish_without_renameat2_and_a_crash_between_its_renames(tmp_path, monkeypatch):
    parent = str(tmp_path)
    publish_set(parent, "set", _writer("one"), LINKS)
    monkeypatch.setattr(run_files, "_exchange", lambda a, b: False)  # a file system without RENAME_EXCHANGE
    publish_set(parent, "set", _writer("two"), LINKS)
    assert _read(parent) == ("two", "two") and sorted(os.listdir(parent)) == ["a.txt", "b.txt", "set"]
    # killed after renaming the old set aside, before renaming the new one in: no set (never a mix) ...
    os.rename(tmp_path / "set", tmp_path / ".set.old-host-1")
    os.makedirs(tmp_path / ".set.new-host-1")
    with pytest.raises(FileNotFoundError):
        _read(parent)
    # ... and the next publish restores the old one before writing, then swaps in the new one
    seen = {}
    publish_set(parent, "set", lambda folder: seen.update(old=_read(parent)) or _writer("three")(folder), LINKS)
    assert seen["old"] == ("two", "two") and _read(parent) == ("three", "three")
    assert sorted(os.listdir(parent)) == ["a.txt", "b.txt", "set"]


KILLED_AT_PUBLISH = r"""
import os, signal, sys
sys.path.insert(0, {root!r})
import protocols.w2s.report as report

def killed(*args, **kwargs):  # the tables are written into the new set; the figures are next: SIGKILL here
    os.kill(os.getpid(), signal.SIGKILL)

report.write_figures = killed
from protocols.w2s.protocol import main
main(["--config", {config!r}])
"""


def _rows(out) -> tuple[list, list]:
    """The methods of results.json and of results.md's first table, read through the stable names."""
    rows = list(json.load(open(os.path.join(out, "results.json")))["rows"])
    table = next(block for block in open(os.path.join(out, "results.md")).read().split("\n\n")
                 if block.startswith("| method"))
    return rows, [line.split("|")[1].strip() for line in table.splitlines()[2:]]


@pytest.mark.slow  # about 60 s on busy cores: make test-slow (the fast suite's budget)
def test_a_run_killed_while_publishing_leaves_the_old_set_and_the_rerun_equals_a_clean_run(
        tmp_path, word_tokenizer_dir, cache_dir):
    cfg = _tiny_protocol(tmp_path, word_tokenizer_dir, cache_dir)
    run_protocol(["--config", _write(tmp_path, cfg)])
    out = cfg["out_dir"]
    assert _rows(out) == (["teacher", "naive"], ["teacher", "naive"])

    more = dict(cfg, methods=cfg["methods"] + [{"name": "confidence", "objective": "confidence"}])
    config = _write(tmp_path, more, "more.yaml")
    env = dict(os.environ, PYTHONPATH=ROOT)
    child = subprocess.run([sys.executable, "-c", KILLED_AT_PUBLISH.format(root=ROOT, config=config)], env=env,
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert _rows(out) == (["teacher", "naive"], ["teacher", "naive"])  # the old set, whole
    assert glob.glob(os.path.join(out, ".results.new-*"))  # the killed run's half-written set, an orphan
    assert os.path.isfile(os.path.join(out, "seed0", "confidence", "result.json"))  # its finished stage is kept

    results = run_protocol(["--config", config])  # reuses every stage, publishes the new set
    assert _rows(out) == (["teacher", "naive", "confidence"],) * 2
    assert not glob.glob(os.path.join(out, ".results.*"))  # the orphan is gone
    assert len(glob.glob(os.path.join(out, "results", "summary", "events.out.tfevents.*"))) == 1
    sessions = glob.glob(os.path.join(out, "results", "hparams", "seed0", "*", "events.out.tfevents.*"))
    assert sorted(p.split(os.sep)[-2] for p in sessions) == ["confidence", "naive", "teacher"]  # one each

    clean = dict(more, out_dir=str(tmp_path / "clean"))
    clean_results = run_protocol(["--config", _write(tmp_path, clean, "clean.yaml")])
    as_text = lambda rows: json.dumps(rows, sort_keys=True, default=str)  # noqa: E731 -- NaN cells compare as text
    assert as_text(clean_results["rows"]) == as_text(results["rows"]) == as_text(
        json.load(open(os.path.join(out, "results.json")))["rows"])
    assert open(os.path.join(out, "results.md")).read() == open(os.path.join(clean["out_dir"], "results.md")).read()
