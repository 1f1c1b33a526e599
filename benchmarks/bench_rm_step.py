"""Our reward-model step alone (no Trainer loop), per lever: random vs length-grouped batches, 1-8 buckets, full
last layer vs last-token scoring.

    .venv/bin/python benchmarks/bench_rm_step.py --peak-gflops 93.07

RewardModelModule forward of the 2B sequences + Bradley-Terry loss + backward + AdamW on the benchmark's real
batches (16 pairs), the same module and weights for every variant, one warm-up step; fp32, 2 threads. The
"random, 1 bucket, last_token_scoring 0" row is TRL's batching, padding and work. Prints one JSON line; a markdown table to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--buckets", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--last-token-scoring", nargs="+", type=int, default=[0, 1], choices=[0, 1],
                   help="0: full last layer; 1: last layer's queries/MLP at the pooled token only (the default)")
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--train-pairs", type=int, default=400)
    p.add_argument("--peak-gflops", type=float, default=None)
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench"))
    args = p.parse_args()
    C.offline_env()
    import torch

    peak = args.peak_gflops or C.matmul_peak()["peak_gflops"]
    paths = C.write_workload(args.work_dir, args.train_pairs, 512)
    torch.manual_seed(0)
    model = C.reward_module(paths["tokenizer"])
    params = C.matmul_params(model.backbone)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

    def step(b):
        C.bt_step(model, opt, b)

    rows = []
    for grouped in (False, True):
        dm = C.preference_datamodule(paths, 16, 64, length_grouped=grouped)
        dm.setup("fit")
        batches = [b for _, b in zip(range(args.batches), dm.train_dataloader())]
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        step(batches[0])
        for k, lts in ((k, lts) for k in args.buckets for lts in args.last_token_scoring):
            model.length_buckets, model.last_token_scoring = k, bool(lts)
            times = []
            for b in batches:
                t0 = time.perf_counter()
                step(b)
                times.append(time.perf_counter() - t0)
            total = sum(times)
            rows.append({"batching": "grouped" if grouped else "random", "buckets": k, "last_token_scoring": lts,
                         "step_s_median": round(statistics.median(times), 4), "tokens_per_s": round(real / total, 1),
                         "useful_mfu": round(C.mfu(params, real, total, peak), 4)})
            C.eprint(json.dumps(rows[-1]))
    base = next(r for r in rows if r["batching"] == "random" and r["buckets"] == 1
                and r["last_token_scoring"] == min(args.last_token_scoring))["step_s_median"]
    for r in rows:
        r["speedup_vs_trl_batching"] = round(base / r["step_s_median"], 3)
    C.eprint(C.markdown_table(list(rows[0]), [list(r.values()) for r in rows]))
    print(json.dumps({"bench": "rm_step", "machine": C.machine_info(), "peak_gflops": peak, "rows": rows}))


if __name__ == "__main__":
    main()
