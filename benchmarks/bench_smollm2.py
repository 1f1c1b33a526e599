"""Speed probe (not a test): SmolLM2-135M-Instruct as a reward-model backbone on this CPU, fp32 vs bf16 autocast.

    .venv/bin/python benchmarks/bench_smollm2.py [--batch 8] [--tokens 128] [--compare 1x64] [--steps 2]

The workload is one reward-model training step at full fine-tuning: the base transformer ("smollm2" resolved like
the configs do, converted on first use: docs/models.md) on a batch of sequences of random token ids, a
scalar head on the last token, forward + backward of the summed rewards. Runs, each in its own worker process (peak
RSS per run), `--warmup` untimed steps then `--steps` timed ones:
  fp32 at `--batch` x `--tokens` (a reward-model-sized batch), then fp32 and bf16 autocast at `--compare`: on a CPU
  without native bf16 (AVX2 only, like the AMD EPYC of our dev machines) autocast emulates bf16 and one 8 x 128 step
  takes minutes, so the precisions are compared on a smaller batch by default (`--compare 8x128`: the full batch).
The parent prints one JSON line: tokens/s (median over the timed steps), seconds per step, peak RSS, the machine
and its load. ~2 min on 2 quiet cores (more under load: the figures then vary by 2x and more).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

VARIANTS = ("fp32", "bf16-autocast")


def worker(variant: str, batch: int, tokens: int, steps: int, warmup: int) -> dict:
    import torch
    from transformers import AutoModel

    from datamodules.tokenizers import resolve_pretrained

    t0 = time.perf_counter()
    backbone = AutoModel.from_pretrained(resolve_pretrained("smollm2"), dtype=torch.float32).train()
    load_seconds = time.perf_counter() - t0
    head = torch.nn.Linear(backbone.config.hidden_size, 1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(17, backbone.config.vocab_size, (batch, tokens), generator=gen)  # past the 17 specials
    mask = torch.ones_like(ids)
    times = []
    for step in range(warmup + steps):
        backbone.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant == "bf16-autocast"):
            hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, H)
            rewards = head(hidden[:, -1]).squeeze(-1)  # (B,): last token (no padding here)
        rewards.float().sum().backward()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    per_step = C.summary(times, digits=3)
    return {"variant": variant, "load_seconds": round(load_seconds, 2), "seconds_per_step": per_step,
            "tokens_per_s": round(batch * tokens / per_step["median"], 1),
            "parameters": sum(p.numel() for p in backbone.parameters()), "peak_rss_mb": round(C.peak_rss_mb(), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--compare", default="1x64", help="BATCHxTOKENS of the fp32 vs bf16 comparison")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--worker", choices=VARIANTS, default=None)
    args = parser.parse_args()
    C.offline_env()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, args.tokens, args.steps, args.warmup)))
        return
    from datamodules.tokenizers import resolve_pretrained

    resolve_pretrained("smollm2")  # convert (once) here, not inside a timed worker
    compare = tuple(int(x) for x in args.compare.split("x"))
    runs = [("fp32", (args.batch, args.tokens)), ("fp32", compare), ("bf16-autocast", compare)]
    results = {}
    for variant, (batch, tokens) in dict.fromkeys(runs):  # one fp32 run when the two shapes agree
        key = f"{variant}@{batch}x{tokens}"
        results[key] = C.run_worker(os.path.abspath(__file__), [
            f"--worker={variant}", f"--batch={batch}", f"--tokens={tokens}", f"--steps={args.steps}",
            f"--warmup={args.warmup}"], timeout=900)
        C.eprint(key, json.dumps(results[key]))
    pair = [results[f"{v}@{args.compare}"]["tokens_per_s"] for v in VARIANTS]
    print(json.dumps({"bench": "smollm2", "threads": C.THREADS, "machine": C.machine_info(),
                      f"bf16_over_fp32@{args.compare}": round(pair[1] / pair[0], 3), "results": results}))


if __name__ == "__main__":
    main()
