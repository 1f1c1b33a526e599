"""Reward-model evaluation throughput: ours (`Trainer.test` of RewardModelModule) vs TRL's `RewardTrainer.evaluate`.

    .venv/bin/python benchmarks/bench_rm_eval.py --repeats 3
    .venv/bin/python benchmarks/bench_rm_eval.py --base smollm2 --variants ours trl --repeats 2 --test-pairs 128

Same model weights for all (TRL's model is a copy of ours), the same test pairs, 64 pairs per batch, fp32,
2 threads. One process; after one untimed warm-up call each, the variants' full evaluation calls are interleaved
(`repeats` rounds). Accuracies are reported too: with identical weights they must agree.
`--base smollm2` (or a model directory): ours is that base + our last-token head, TRL's model is
AutoModelForSequenceClassification loaded from the same directory (fp32) with a copy of our head; the pairs are
written in words its tokenizer keeps whole and rendered with its chat template (bench_rm_train.py).

Variants (levers, before/after):
    trl      TRL: pairs in dataset order, right-padded to the batch's longest sequence, one forward
    sorted   ours: pairs sorted by length (the datamodule's eval order), one padded forward per batch, full last layer
    full_last_layer  + each batch's 128 sequences scored in up to 8 length buckets (`--model.length_buckets 8`)
    ours     + last-token scoring (the default): the last layer's queries and MLP at the pooled token only
Prints one JSON line; a markdown table to stderr.
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

SPLIT = "ultrafeedback"
VARIANTS = {"sorted": dict(length_buckets=1, last_token_scoring=False),
            "full_last_layer": dict(length_buckets=8, last_token_scoring=False),
            "ours": dict(length_buckets=8, last_token_scoring=True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["ours", "sorted", "trl"], choices=[*VARIANTS, "trl"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--test-pairs", type=int, default=512)
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench"))
    p.add_argument("--peak-gflops", type=float, default=None)
    C.add_base_argument(p)
    args = p.parse_args()
    C.offline_env()
    base_path = C.resolve_base(args.base)
    import datasets
    import lightning.pytorch as pl
    import torch
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    peak = {"peak_gflops": args.peak_gflops} if args.peak_gflops else C.matmul_peak()
    paths = C.write_workload(args.work_dir, 64, args.test_pairs, base_path=base_path)
    dm = C.preference_datamodule(paths, 16, args.eval_batch_size)
    dm.prepare_data()
    dm.setup("test")
    torch.manual_seed(0)
    ours = C.reward_module(paths["tokenizer"], base_path=base_path).eval()
    params = C.matmul_params(ours.backbone)
    test = dm.datasets[f"test/{SPLIT}"]
    rows = sorted((test[i] for i in range(len(test))), key=lambda r: r["index"])  # the source's order
    real_tokens = sum(len(r["a_input_ids"]) + len(r["b_input_ids"]) for r in rows)

    trl_model = C.sequence_classifier(ours, base_path)
    eval_ds = datasets.Dataset.from_dict({"chosen_ids": [r["a_input_ids"] for r in rows],
                                          "rejected_ids": [r["b_input_ids"] for r in rows]})
    trl_positions: list[int] = []

    class CountingCollator(DataCollatorForPreference):
        def torch_call(self, examples):
            batch = super().torch_call(examples)
            trl_positions.append(batch["attention_mask"].numel())
            return batch

    trl_args = RewardConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_eval_"), per_device_eval_batch_size=args.eval_batch_size,
        bf16=False, gradient_checkpointing=False, use_cpu=True, report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, max_length=None, eval_strategy="no", save_strategy="no")
    trl = RewardTrainer(model=trl_model, args=trl_args, train_dataset=eval_ds, eval_dataset=eval_ds,
                        processing_class=dm.tokenizer,
                        data_collator=CountingCollator(pad_token_id=dm.tokenizer.pad_token_id))
    torch.set_num_threads(C.THREADS)
    ours_trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                              enable_model_summary=False, default_root_dir=tempfile.mkdtemp(prefix="bench_rm_eval_"))
    from lightning_modules.fast.length_buckets import processed_positions

    def run(variant: str) -> dict:
        trl_positions.clear()
        t0 = time.perf_counter()
        if variant == "trl":
            metrics = trl.evaluate()
            seconds = time.perf_counter() - t0
            acc, positions = metrics["eval_accuracy"], sum(trl_positions)
        else:
            for key, value in VARIANTS[variant].items():
                setattr(ours, key, value)
            ours_trainer.test(ours, datamodule=dm, verbose=False)
            seconds = time.perf_counter() - t0
            acc = ours.test_results[SPLIT]["acc"]
            positions = 0
            for s in range(0, len(test), args.eval_batch_size):
                batch = [test[i] for i in range(s, min(s + args.eval_batch_size, len(test)))]
                lengths = [len(r["a_input_ids"]) for r in batch] + [len(r["b_input_ids"]) for r in batch]
                positions += processed_positions(lengths, VARIANTS[variant]["length_buckets"])
        return {"seconds": seconds, "pairs_per_s": len(rows) / seconds, "acc": acc,
                "padding_fraction": 1 - real_tokens / positions,
                "useful_mfu_fwd": C.mfu(params, real_tokens, seconds, peak["peak_gflops"], factor=2)}

    for v in args.variants:  # warm-up: allocations, lazy imports, dataset caches
        run(v)
    runs = C.interleave(args.variants, args.repeats, lambda v, r: run(v), C.eprint)
    keys = ("pairs_per_s", "padding_fraction", "useful_mfu_fwd", "acc", "seconds")
    table = {v: {k: C.summary([r[k] for r in rs], 4) for k in keys} for v, rs in runs.items()}
    out = {"bench": "rm_eval", "machine": C.machine_info(), "matmul": peak,
           "config": {**C.reward_base_config(args.base, paths), "test_pairs": len(rows),
                      "mean_sequence_tokens": round(real_tokens / (2 * len(rows)), 1),
                      "eval_batch_pairs": args.eval_batch_size, "repeats": args.repeats, "threads": C.THREADS,
                      "dtype": "fp32"},
           "results": table}
    if "trl" in runs:
        out["ratios_vs_trl"] = {
            v: {"pairs_per_s": round(table[v]["pairs_per_s"]["median"] / table["trl"]["pairs_per_s"]["median"], 3),
                "per_round": [round(a["pairs_per_s"] / b["pairs_per_s"], 3) for a, b in zip(rs, runs["trl"])]}
            for v, rs in runs.items() if v != "trl"}
    C.eprint(C.markdown_table(["variant", "pairs/s", "padding", "useful fwd MFU", "acc"],
                              [[v, *(f"{t[k]['median']} [{t[k]['min']}, {t[k]['max']}]" for k in keys[:4])]
                               for v, t in table.items()]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
