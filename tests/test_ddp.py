"""Under DDP (2 CPU processes, gloo) every pair is counted once: accuracies equal the single-process ones exactly,
on splits of 41 pairs (odd: the default DistributedSampler repeats one pair to pad)."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "ddp_eval_script.py")


def _run(tok, cache, out, devices):
    env = dict(os.environ)
    env.pop("MASTER_PORT", None)
    proc = subprocess.run([sys.executable, SCRIPT, tok, cache, out, str(devices)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(SCRIPT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


def test_ddp_accuracy_equals_single_process(word_tokenizer_dir, cache_dir, tmp_path):
    single = _run(word_tokenizer_dir, cache_dir, str(tmp_path / "one.json"), 1)
    double = _run(word_tokenizer_dir, cache_dir, str(tmp_path / "two.json"), 2)
    assert double == single
    assert all(r["pairs"] == 41 for r in single.values())
