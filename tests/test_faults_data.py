"""Fault injection on data preparation: a process SIGKILLed while it writes a tokenized split (no `finally`, no
atexit runs) leaves a half-written temp folder and its raw columns behind; the next run, in a fresh process, must
never load them, must prepare exactly what a clean run prepares, and must remove them."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import SOURCE, TARGETS, synth_options, tiny_data

REPO = Path(__file__).resolve().parent.parent

# The child prepares the data module; with a kill count it first wraps `Dataset.save_to_disk` (a test-only hook,
# no product code) so that the n-th tokenized split is written into its temp folder, half its Arrow file cut off,
# and the process then kills itself with SIGKILL, as an OOM killer or `kill -9` would, mid-write.
CHILD = r"""
import glob, json, os, signal, sys

import datasets

from datamodules.preference.datamodule import PreferenceDataModule

kwargs, out, kill_at = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if kill_at:
    real, saves = datasets.Dataset.save_to_disk, []

    def save_then_die(self, path, *args, **kw):
        real(self, path, *args, **kw)
        if not os.path.basename(path).startswith("part"):  # a tokenized split (raw columns are saved as parts)
            saves.append(path)
            if len(saves) == kill_at:
                arrow = max(glob.glob(os.path.join(path, "*.arrow")), key=os.path.getsize)
                with open(arrow, "r+b") as f:
                    f.truncate(os.path.getsize(arrow) // 2)
                os.kill(os.getpid(), signal.SIGKILL)

    datasets.Dataset.save_to_disk = save_then_die
dm = PreferenceDataModule(**kwargs)
dm.setup("fit")  # without prepare_data, so that the manifest tells which splits came from the cache
rows = {kind: [ds[i] for i in range(len(ds))] for kind, ds in dm.datasets.items()}
with open(out, "w") as f:
    json.dump({"rows": rows, "cached": {k: v["cached"] for k, v in dm.manifest["tokenization"].items()}}, f)
"""


COMPLETE = re.compile(r"^[a-z_]+-[0-9a-f]{20}-[0-9a-f]{12}$")  # <kind>-<records fingerprint>-<tokenizer key>


def run_child(kwargs: dict, out: Path, kill_at: int = 0) -> tuple[subprocess.Popen, str]:
    """(the finished child, its output): prepares the data module in a fresh process, killed at the kill_at-th split."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(kwargs), str(out), str(kill_at)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    return child, child.communicate(timeout=300)[0].decode(errors="replace")


def index(cache_dir: Path) -> dict:
    (path,) = glob.glob(str(cache_dir / "prepared" / "*.json"))
    with open(path) as f:
        return json.load(f)


def test_sigkill_while_caching_a_split_then_a_fresh_run_prepares_what_a_clean_run_prepares(word_tokenizer_dir,
                                                                                            tmp_path):
    kwargs = dict(source=SOURCE, ood_targets=TARGETS, tokenizer=word_tokenizer_dir, source_options=synth_options(),
                  batch_size=16, eval_batch_size=16, max_length=96, seed=0, train_subset="teacher")
    killed_cache, clean_cache = tmp_path / "killed", tmp_path / "clean"
    tokenized = killed_cache / "tokenized"

    killed, log = run_child({**kwargs, "cache_dir": str(killed_cache)}, tmp_path / "killed.json", kill_at=3)
    assert killed.returncode == -signal.SIGKILL, log
    entries = os.listdir(tokenized)
    assert sorted(e.split("-")[0] for e in entries if COMPLETE.match(e)) == ["train_teacher", "validation"]
    orphans = sorted(e for e in entries if not COMPLETE.match(e))  # the half-written split and its raw columns
    split = orphans[0].split(".")[0]  # the final name of the split that was being written
    owner = f"tmp-{socket.gethostname()}-{killed.pid}"
    assert split.startswith(f"test__{SOURCE}-") and orphans == sorted([f"{split}.{owner}", f"{split}.raw.{owner}"])
    assert not (killed_cache / "prepared").exists()  # the index is written last

    rerun, log = run_child({**kwargs, "cache_dir": str(killed_cache)}, tmp_path / "rerun.json")
    assert rerun.returncode == 0, log
    assert all(COMPLETE.match(e) for e in os.listdir(tokenized))  # the killed run's orphans are gone
    assert len(os.listdir(tokenized)) == 5
    with open(tmp_path / "rerun.json") as f:
        result = json.load(f)
    # The two splits finished before the kill are reused; the half-written one is tokenized again, never loaded.
    assert result["cached"] == {"train_teacher": True, "validation": True, f"test/{SOURCE}": False,
                                **{f"test/{t}": False for t in TARGETS}}

    clean = tiny_data(word_tokenizer_dir, str(clean_cache))
    clean.setup("fit")
    clean_rows = {kind: [ds[i] for i in range(len(ds))] for kind, ds in clean.datasets.items()}
    assert result["rows"] == json.loads(json.dumps(clean_rows))
    assert index(killed_cache)["fingerprints"] == index(clean_cache)["fingerprints"]
    assert sorted(os.listdir(tokenized)) == sorted(os.listdir(clean_cache / "tokenized"))
