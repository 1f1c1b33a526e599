"""The README's quick start, run as a new user would: every marked block, as written, in a fresh copy of the checkout.

A block is a fenced ```bash block after `<!-- quickstart: NAME -->`. The copy holds what a clone holds (the tracked
files, plus files not yet committed that git does not ignore), nothing a run wrote; `python` is this interpreter's venv.
The only change to a block is its size: the example files are written at `TINY_DATA` instead of the defaults, so that
each block runs in well under a minute; every command, flag and path is the README's own. Each test then checks that
the block ended as the README says it does.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
TINY_DATA = "--n_train 80 --n_test 40"


def quickstart_blocks(text: str) -> dict[str, str]:
    blocks = {}
    for m in re.finditer(r"<!-- quickstart: ([\w-]+) -->\s*```bash\n(.*?)```", text, flags=re.S):
        blocks[m.group(1)] = m.group(2)
    return blocks


def fresh_copy(dest: str) -> str:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):  # deleted in the work tree, not yet committed
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel))
    return dest


def run_block(name: str, tmp_path) -> str:
    block = quickstart_blocks(open(README).read())[name]
    block = re.sub(r"(python -m datamodules\.preference\.example_files \S+)", rf"\1 {TINY_DATA}", block)
    repo = fresh_copy(str(tmp_path / "clone"))
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, f"README block {name!r} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return repo, proc.stdout + proc.stderr


def test_the_readme_names_every_docs_page_and_starts_own_data_early():
    text = open(README).read()
    pages = sorted(p for p in os.listdir(os.path.join(ROOT, "docs")) if p.endswith(".md"))
    missing = [p for p in pages if f"(docs/{p})" not in text]
    assert not missing, f"docs pages the README's index does not link: {missing}"
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines, 1) if "example_files" in line or "local:" in line)
    assert first <= 40, f"the first command for one's own data is on line {first} of README.md"
    assert set(quickstart_blocks(text)) >= {"reward-model", "w2s", "mixture"}


def test_quickstart_reward_model(tmp_path):
    repo, out = run_block("reward-model", tmp_path)
    version = os.path.join(repo, "runs", "my_rm", "version_0")
    assert os.path.isfile(os.path.join(version, "checkpoints", "last.ckpt"))
    assert not os.path.exists(os.path.join(repo, "runs", "my_rm", "version_1")), "test made a new version folder"
    # test's one table: the ID file and the shifted file, once each
    rows = re.findall(r"^\| (local:my_data/\S+) \| (ID|OOD) \| (\d+) \| ([\d.]+) \|$", out, flags=re.M)
    assert [(r[0], r[1], r[2]) for r in rows] == [("local:my_data/my_pairs", "ID", "40"),
                                                  ("local:my_data/my_ood.jsonl", "OOD", "40")], out[-3000:]
    assert os.path.isfile(os.path.join(version, "test", "last", "test_results.json"))  # beside what it tested
    # the exported model, through plain transformers, orders the held-out pairs as `cli.py test` did
    right, n = map(int, re.search(r"chosen preferred on (\d+) of (\d+) held-out pairs", out).groups())
    assert n == 40 and abs(100.0 * right / n - float(rows[0][3])) < 1e-6, (right, rows[0])
    assert "[fit] best validation" in out and "[fit] last validation" in out


@pytest.mark.slow
def test_quickstart_w2s(tmp_path):
    repo, _ = run_block("w2s", tmp_path)
    results = json.load(open(os.path.join(repo, "runs", "my_w2s", "results.json")))
    table = open(os.path.join(repo, "runs", "my_w2s", "results.md")).read()
    for row in ("teacher", "ceiling", "naive", "anchor"):
        assert f"| {row} |" in table
    assert results


@pytest.mark.slow
def test_quickstart_mixture(tmp_path):
    repo, out = run_block("mixture", tmp_path)
    report = open(os.path.join(repo, "runs", "mixture", "topics", "experiment_seeds_0_results.md")).read()
    assert "## GRPO on geo (`rl_geo`)" in report
    assert re.search(r"^\| geo \| yes \|", report, flags=re.M) and re.search(r"^\| math \| no \|", report, flags=re.M)
