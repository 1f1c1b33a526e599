"""Reward-model training throughput on one GPU, ours (Lightning Trainer + RewardModelModule) vs TRL's RewardTrainer.

    python benchmarks/gpu_throughput.py --models WORK/models --data WORK/bench/data-512-256-0 --steps 30

The GPU counterpart of bench_rm_train.py (which hard-codes accelerator="cpu"): the same synthetic pairs
(benchmarks/common.py), the same local Qwen2 stand-in loaded by directory (its dtype as saved), batch 16 pairs,
AdamW lr 1e-5, bf16 autocast on both sides, `--steps` steps; the first 3 steps are excluded from the timing.
Prints one JSON line: pairs/s and peak GPU memory per variant, and ours / TRL.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

WARMUP = 3


def steady_rate(marks: list[float], pairs: int) -> float:
    gaps = [b - a for a, b in zip(marks[WARMUP:], marks[WARMUP + 1:])]
    return round(pairs / sorted(gaps)[len(gaps) // 2], 2) if gaps else float("nan")


def ours(model_dir: str, data_dir: str, steps: int, batch: int) -> dict:
    import lightning.pytorch as pl
    import torch

    from lightning_modules.reward.reward_model import RewardModelModule

    paths = {"tokenizer": model_dir, "data_dir": data_dir, "cache_dir": os.path.join(data_dir, "..", "cache")}
    dm = C.preference_datamodule(paths, batch, 64)
    module = RewardModelModule(backbone=model_dir, tokenizer=model_dir,
                               optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5, weight_decay=0.0))
    marks: list[float] = []

    class Timing(pl.Callback):
        def on_train_batch_end(self, *a):
            torch.cuda.synchronize()
            marks.append(time.perf_counter())

    torch.cuda.reset_peak_memory_stats()
    trainer = pl.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Timing()],
                         default_root_dir=tempfile.mkdtemp(prefix="gpu_rm_"))
    trainer.fit(module, datamodule=dm)
    return {"pairs_per_s": steady_rate(marks, batch), "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "steps": int(trainer.global_step), "param_dtype": str(next(module.parameters()).dtype)}


def trl(model_dir: str, data_dir: str, steps: int, batch: int) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForSequenceClassification, TrainerCallback
    from trl import RewardConfig, RewardTrainer

    paths = {"tokenizer": model_dir, "data_dir": data_dir, "cache_dir": os.path.join(data_dir, "..", "cache")}
    dm = C.preference_datamodule(paths, batch, 64)
    dm.setup("fit")
    train = dm._train_set()
    rows = [train[i] for i in range(len(train))]
    ds = datasets.Dataset.from_dict({"chosen_ids": [r["a_input_ids"] for r in rows],
                                     "rejected_ids": [r["b_input_ids"] for r in rows]})
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    model.config.pad_token_id = dm.tokenizer.pad_token_id
    marks: list[float] = []

    class Timing(TrainerCallback):
        def on_step_end(self, *a, **k):
            torch.cuda.synchronize()
            marks.append(time.perf_counter())

    torch.cuda.reset_peak_memory_stats()
    config = RewardConfig(
        output_dir=tempfile.mkdtemp(prefix="gpu_trl_"), per_device_train_batch_size=batch, max_steps=steps,
        learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0,
        optim="adamw_torch", bf16=True, gradient_checkpointing=False, report_to=[], save_strategy="no",
        eval_strategy="no", logging_steps=10_000, disable_tqdm=True, dataloader_num_workers=0, seed=0,
        max_length=None)
    RewardTrainer(model=model, args=config, train_dataset=ds, processing_class=dm.tokenizer,
                  callbacks=[Timing()]).train()
    return {"pairs_per_s": steady_rate(marks, batch), "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "steps": len(marks), "param_dtype": str(next(model.parameters()).dtype)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="the directory of gpu_check.py's stand-ins (uses <models>/qwen2)")
    p.add_argument("--data", required=True, help="the benchmark pairs directory (train_prefs / test_prefs)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--variant", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = p.parse_args()
    C.offline_env()
    model_dir = os.path.join(args.models, "qwen2")
    if args.variant:  # one variant per process: peak memory and allocator state are its own
        fn = ours if args.variant == "ours" else trl
        print(json.dumps(fn(model_dir, args.data, args.steps, args.batch_size)))
        return
    import subprocess

    out = {"bench": "rm_train_gpu", "steps": args.steps, "batch_pairs": args.batch_size, "precision": "bf16",
           "model": model_dir}
    for v in ("ours", "trl"):
        proc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", v], capture_output=True,
                              text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            C.eprint(proc.stderr[-3000:])
            raise SystemExit(f"gpu_throughput: variant {v} failed (exit {proc.returncode})")
        out[v] = json.loads(lines[-1])
    out["pairs_per_s"] = {v: out[v]["pairs_per_s"] for v in ("ours", "trl")}
    out["ours_over_trl"] = round(out["ours"]["pairs_per_s"] / out["trl"]["pairs_per_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
