"""How our reward-model training step grows with sequence length and batch size, and data preparation with size.

    .venv/bin/python benchmarks/bench_scaling.py

Step: one training step of RewardModelModule's computation (one forward of 2B sequences of T tokens, no padding,
Bradley-Terry loss, backward, AdamW step), median over `--steps` after one warm-up; fp32, 2 threads. Memory:
the highest RSS seen during the configuration's steps minus the RSS before the first configuration (configs run
in ascending size, so each peak is its own). Data preparation: PreferenceDataModule `prepare_data` + `setup`
(tokenization, atomic cache write, reload) on a fresh cache, then `setup` again from the cache.
Prints one JSON line; markdown tables to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402
from benchmarks.bench_anchor import RssSampler, current_rss_mb  # noqa: E402


def step_table(args, paths: dict, peak: float) -> list[dict]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = C.reward_module(paths["tokenizer"])
    params = C.matmul_params(model.backbone)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    base = current_rss_mb()
    configs = [(args.batch_for_length, t) for t in args.lengths] + [(b, args.length_for_batch) for b in args.batches]
    configs = sorted(set(configs), key=lambda c: c[0] * c[1])
    rows = []
    for pairs, length in configs:
        ids = torch.randint(10, C.VOCAB_SIZE, (2 * pairs, length))
        mask = torch.ones_like(ids)
        times = []
        with RssSampler() as rss:
            for i in range(args.steps + 1):
                t0 = time.perf_counter()
                rewards, _ = model(ids, mask)
                r_a, r_b = rewards.chunk(2)
                loss = -F.logsigmoid(r_a - r_b).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if i:
                    times.append(time.perf_counter() - t0)
        step = statistics.median(times)
        rows.append({"pairs": pairs, "seq_len": length, "step_s": round(step, 4),
                     "tokens_per_s": round(2 * pairs * length / step, 1),
                     "mfu": round(C.mfu(params, 2 * pairs * length, step, peak), 4),
                     "peak_rss_increment_mb": round(rss.peak - base, 1)})
        C.eprint(json.dumps(rows[-1]))
    return rows


def data_table(args, work: str) -> list[dict]:
    from benchmarks.common import preference_datamodule, write_workload

    rows = []
    for n in args.dataset_sizes:
        paths = write_workload(work, n, 64)
        shutil.rmtree(paths["cache_dir"], ignore_errors=True)
        t0 = time.perf_counter()
        dm = preference_datamodule(paths, 16, 64)
        dm.prepare_data()
        dm.setup("fit")
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        dm2 = preference_datamodule(paths, 16, 64)
        dm2.setup("fit")
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_batches = sum(1 for _ in dm2.train_dataloader())
        loader = time.perf_counter() - t0
        rows.append({"pairs": n, "prepare_cold_s": round(cold, 3), "setup_cached_s": round(warm, 3),
                     "one_epoch_of_batches_s": round(loader, 3), "batches": n_batches})
        C.eprint(json.dumps(rows[-1]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", nargs="+", type=int, default=[32, 64, 128, 256])
    p.add_argument("--batch-for-length", type=int, default=16)
    p.add_argument("--batches", nargs="+", type=int, default=[4, 8, 16, 32])
    p.add_argument("--length-for-batch", type=int, default=128)
    p.add_argument("--dataset-sizes", nargs="+", type=int, default=[250, 1000, 4000])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--peak-gflops", type=float, default=None)
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench_scaling"))
    args = p.parse_args()
    C.offline_env()
    peak = {"peak_gflops": args.peak_gflops} if args.peak_gflops else C.matmul_peak()
    paths = C.write_workload(args.work_dir, 64, 64)
    steps = step_table(args, paths, peak["peak_gflops"])
    data = data_table(args, args.work_dir)
    out = {"bench": "scaling", "machine": C.machine_info(), "matmul": peak,
           "config": {"model": C.MODEL_OVERRIDES, "vocab": C.VOCAB_SIZE, "threads": C.THREADS, "dtype": "fp32"},
           "step": steps, "data_preparation": data}
    C.eprint(C.markdown_table(list(steps[0]), [list(r.values()) for r in steps]))
    C.eprint(C.markdown_table(list(data[0]), [list(r.values()) for r in data]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
