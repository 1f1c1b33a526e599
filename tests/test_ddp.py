"""Under DDP (2 CPU processes, gloo) every pair is counted once: accuracies and transfer scores equal the
single-process ones exactly, on splits of 41 pairs (odd: the default DistributedSampler repeats one pair to pad);
the teacher's labels are computed once (rank 0, prepare_data) and found by both ranks."""
import json
import os
import subprocess
import sys

import lightning.pytorch as pl

from tests.helpers import quiet_trainer, tiny_data, tiny_model

SCRIPT = os.path.join(os.path.dirname(__file__), "ddp_eval_script.py")


def _run(tok, cache, out, devices, teacher):
    env = dict(os.environ)
    env.pop("MASTER_PORT", None)
    proc = subprocess.run([sys.executable, SCRIPT, tok, cache, out, str(devices), teacher], env=env,
                          capture_output=True, text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(SCRIPT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


def test_ddp_scores_equal_single_process(word_tokenizer_dir, cache_dir, tmp_path):
    pl.seed_everything(1)
    teacher = tiny_model(word_tokenizer_dir)
    trainer = quiet_trainer(str(tmp_path), max_steps=3, limit_val_batches=0)
    trainer.fit(teacher, tiny_data(word_tokenizer_dir, cache_dir))
    ckpt = str(tmp_path / "teacher.ckpt")
    trainer.save_checkpoint(ckpt)

    double = _run(word_tokenizer_dir, cache_dir, str(tmp_path / "two.json"), 2, ckpt)
    single = _run(word_tokenizer_dir, cache_dir, str(tmp_path / "one.json"), 1, ckpt)
    assert double == single
    splits = [k for k in single if k != "transfer"]
    assert len(splits) == 3 and all(single[k]["pairs"] == 41 for k in splits)
    assert single["transfer"]["pairs"] == {k: 41 for k in splits}
    labels = os.listdir(os.path.join(cache_dir, "weak_labels"))
    assert len(labels) == 1 and labels[0].endswith(".json")  # computed once, reused by the second run
