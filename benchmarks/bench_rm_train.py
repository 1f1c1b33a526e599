"""Reward-model training throughput, ours (Lightning Trainer + RewardModelModule) vs TRL's RewardTrainer.

    .venv/bin/python benchmarks/bench_rm_train.py --repeats 3
    .venv/bin/python benchmarks/bench_rm_train.py --variants padded grouped ours random_buckets bf16 --repeats 1
    .venv/bin/python benchmarks/bench_rm_train.py --base smollm2 --variants ours trl --repeats 2 --train-pairs 160

Same workload for every variant: the Qwen2-style backbone of `common.MODEL_OVERRIDES` over a 2,048-token
word-level tokenizer, the same pairs (23-243 tokens), the same initial weights (TRL's model gets a copy of ours),
16 pairs per step, AdamW (lr 1e-3, no weight decay, constant), one epoch, fp32, 2 threads, no gradient
clipping, TRL's gradient checkpointing and bf16 off. Each run is a fresh process (peak RSS per run); variants
are interleaved; round r uses seed r for data order and initial weights (the same for every variant).
Held-out accuracy is measured after the run on the same test pairs with one scoring loop for all.
`--base smollm2` (or a model directory): both sides full-fine-tune that pretrained base in fp32 (ours: base
transformer + our last-token head; TRL: AutoModelForSequenceClassification on the same directory, its score head
a copy of ours), the pairs written in words its tokenizer keeps whole and rendered with its chat template; lr 1e-5
unless `--lr` says otherwise.

Variants (ours = the tuned configuration; the others are the levers, before/after):
    trl             TRL RewardTrainer (random batches, right-padded to the batch's longest sequence)
    padded          ours with TRL's batching: random batches, one padded forward
    grouped         + length-grouped batches (the default sampler)
    ours            + length-bucketed forwards within the step (`--model.length_buckets 4`) + last-token scoring
                    (`--model.last_token_scoring`, the default: the last layer's queries/MLP at the pooled token only)
    full_last_layer ours without last-token scoring (the full last layer: ours before that lever)
    random_buckets  random batches (as TRL) + up to 8 length-bucketed forwards per step
    bf16            ours under bf16-mixed autocast (changes numerics)
Prints one JSON line; a markdown table to stderr.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

VARIANTS = {
    "padded": dict(length_grouped=False, length_buckets=1, last_token_scoring=False),
    "grouped": dict(length_grouped=True, length_buckets=1, last_token_scoring=False),
    "ours": dict(length_grouped=True, length_buckets=4),
    "full_last_layer": dict(length_grouped=True, length_buckets=4, last_token_scoring=False),
    "random_buckets": dict(length_grouped=False, length_buckets=8),
    "bf16": dict(length_grouped=True, length_buckets=4, precision="bf16-mixed"),
}
TEST_SPLIT = "test/ultrafeedback"


def test_accuracy(score_pairs, dataset, pad_id: int, batch_size: int = 64) -> float:
    """P(r(chosen) > r(rejected)) on `dataset`, one loop for every implementation (our collator, right padding)."""
    import torch
    from torch.utils.data import DataLoader

    from datamodules.preference.collate import PairCollator

    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=PairCollator(pad_id, "right"))
    correct = total = 0
    with torch.inference_mode():
        for batch in loader:
            margin = score_pairs(batch["input_ids"], batch["attention_mask"])  # (B,)
            correct += int((margin > 0).sum())
            total += len(margin)
    return correct / total


# --lr default per base: the random model learns from scratch at 1e-3; a pretrained base is fine-tuned
RANDOM_LR, PRETRAINED_LR = 1e-3, 1e-5


def initial_module(paths: dict, seed: int, lr: float, **kwargs):
    import torch

    torch.manual_seed(seed)
    return C.reward_module(paths["tokenizer"], lr=lr, base_path=paths["base_path"], **kwargs)


def worker_ours(args, paths: dict) -> dict:
    import lightning.pytorch as pl
    import torch

    from lightning_modules.fast.length_buckets import processed_positions

    cfg = dict(VARIANTS[args.variant])
    precision = cfg.pop("precision", "32-true")
    grouped = cfg.pop("length_grouped")
    dm = C.preference_datamodule(paths, args.batch_size, 64, seed=args.seed, length_grouped=grouped)
    model = initial_module(paths, args.seed, args.lr, **cfg)
    params = C.matmul_params(model.backbone)
    timer = C.StepTimer(warmup=args.warmup)
    buckets = model.length_buckets

    class Timing(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            lengths = batch["attention_mask"].sum(1).tolist()
            timer.mark(pairs=len(batch["labels"]), real=sum(lengths), processed=processed_positions(lengths, buckets))

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, precision=precision, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[Timing()], default_root_dir=tempfile.mkdtemp(prefix="bench_rm_"),
    )
    torch.manual_seed(args.seed)
    trainable = C.trainable_params(model)
    trainer.fit(model, datamodule=dm)
    model.eval()
    acc = test_accuracy(lambda ids, am: model.pair_margins({"input_ids": ids, "attention_mask": am}),
                        dm.datasets[TEST_SPLIT], dm.tokenizer.pad_token_id)
    return result(timer, params, acc, args, trainable)


def worker_trl(args, paths: dict) -> dict:
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    dm = C.preference_datamodule(paths, args.batch_size, 64, seed=args.seed)
    dm.setup("fit")
    ours = initial_module(paths, args.seed, args.lr)
    model = C.sequence_classifier(ours, paths["base_path"])  # same initial weights as ours
    del ours  # a pretrained base's copy would otherwise stay in memory (peak RSS) through TRL's run
    gc.collect()
    params = C.matmul_params(model.model)
    trainable = C.trainable_params(model)
    train = dm._train_set()
    rows = [train[i] for i in range(len(train))]
    train_ds = datasets.Dataset.from_dict({"chosen_ids": [r["a_input_ids"] for r in rows],
                                           "rejected_ids": [r["b_input_ids"] for r in rows]})
    timer = C.StepTimer(warmup=args.warmup)
    stats: list[dict] = []
    pad_id = dm.tokenizer.pad_token_id

    class CountingCollator(DataCollatorForPreference):
        def torch_call(self, examples):
            batch = super().torch_call(examples)
            am = batch["attention_mask"]
            stats.append(dict(pairs=len(examples), real=int(am.sum()), processed=am.numel()))
            return batch

    class Timing(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            timer.mark(**stats[len(timer.marks)])

    config = RewardConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"), per_device_train_batch_size=args.batch_size,
        num_train_epochs=1, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=0.0, optim="adamw_torch", bf16=False, gradient_checkpointing=False, use_cpu=True,
        report_to=[], save_strategy="no", eval_strategy="no", logging_steps=10_000, disable_tqdm=True,
        dataloader_num_workers=0, seed=args.seed, data_seed=args.seed, max_length=None, model_init_kwargs=None,
    )
    trainer = RewardTrainer(model=model, args=config, train_dataset=train_ds, processing_class=dm.tokenizer,
                            data_collator=CountingCollator(pad_token_id=pad_id), callbacks=[Timing()])
    torch.set_num_threads(C.THREADS)
    trainer.train()
    model.eval()

    def margins(ids, am):
        r = model(input_ids=ids, attention_mask=am).logits.squeeze(-1)
        a, b = r.chunk(2)
        return a - b

    acc = test_accuracy(margins, dm.datasets[TEST_SPLIT], pad_id)
    return result(timer, params, acc, args, trainable)


def result(timer: "C.StepTimer", params: int, acc: float, args, trainable: int) -> dict:
    seconds, items = timer.window()
    pairs = sum(i["pairs"] for i in items)
    real = sum(i["real"] for i in items)
    pad = C.padding_stats((i["real"], i["processed"]) for i in items)
    peak = args.peak_gflops
    return {
        "variant": args.variant, "seed": args.seed, "steps_timed": len(items), "seconds": round(seconds, 3),
        "pairs_per_s": round(pairs / seconds, 3), "tokens_per_s": round(real / seconds, 1),
        "padding_fraction": round(pad["padding_fraction"], 4), "matmul_params": params, "trainable_params": trainable,
        "useful_mfu": round(C.mfu(params, real, seconds, peak), 4),
        "padded_mfu": round(C.mfu(params, pad["processed_positions"], seconds, peak), 4),
        "step_s_median": round(sorted(timer.step_times())[len(timer.step_times()) // 2], 4),
        "test_acc": round(acc, 4), "peak_rss_mb": round(C.peak_rss_mb(), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["ours", "trl"], choices=sorted(VARIANTS) + ["trl"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-pairs", type=int, default=640)
    p.add_argument("--test-pairs", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=None, help="default 1e-3 (random base), 1e-5 (pretrained base)")
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from the timing")
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench"))
    p.add_argument("--peak-gflops", type=float, default=None, help="skip the matmul measurement")
    C.add_base_argument(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    C.offline_env()
    base_path = C.resolve_base(args.base)
    if args.lr is None:
        args.lr = RANDOM_LR if base_path is None else PRETRAINED_LR
    paths = C.write_workload(args.work_dir, args.train_pairs, args.test_pairs, base_path=base_path)
    if args.worker:
        out = worker_trl(args, paths) if args.variant == "trl" else worker_ours(args, paths)
        print(json.dumps(out))
        return

    peak = {"peak_gflops": args.peak_gflops} if args.peak_gflops else C.matmul_peak()
    C.preference_datamodule(paths, args.batch_size, 64).prepare_data()  # tokenize once, before the timed runs
    common = ["--worker", "--train-pairs", str(args.train_pairs), "--test-pairs", str(args.test_pairs),
              "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--warmup", str(args.warmup),
              "--work-dir", args.work_dir, "--peak-gflops", str(peak["peak_gflops"]), "--base", args.base]
    runs = C.interleave(args.variants, args.repeats,
                        lambda v, r: C.run_worker(__file__, common + ["--variant", v, "--seed", str(r)],
                                                  timeout=C.worker_timeout(base_path)),
                        C.eprint)
    keys = ("pairs_per_s", "tokens_per_s", "padding_fraction", "useful_mfu", "padded_mfu", "step_s_median",
            "test_acc", "peak_rss_mb")
    table = {v: {k: C.summary([r[k] for r in rs], 4) for k in keys} for v, rs in runs.items()}
    out = {"bench": "rm_train", "machine": C.machine_info(), "matmul": peak, "config": {
        **C.reward_base_config(args.base, paths), "batch_pairs": args.batch_size, "lr": args.lr,
        "train_pairs": args.train_pairs, "test_pairs": args.test_pairs, "repeats": args.repeats, "threads": C.THREADS,
        "dtype": "fp32"},
        "results": table, "runs": runs}
    if "trl" in runs:
        out["ratios_vs_trl"] = {
            v: {"pairs_per_s": round(table[v]["pairs_per_s"]["median"] / table["trl"]["pairs_per_s"]["median"], 3),
                "per_round": [round(a["pairs_per_s"] / b["pairs_per_s"], 3) for a, b in zip(rs, runs["trl"])]}
            for v, rs in runs.items() if v != "trl"}
    C.eprint(C.markdown_table(
        ["variant", "pairs/s", "tokens/s", "padding", "useful MFU", "padded MFU", "test acc", "peak RSS MB"],
        [[v, *(f"{t[k]['median']} [{t[k]['min']}, {t[k]['max']}]" for k in
               ("pairs_per_s", "tokens_per_s", "padding_fraction", "useful_mfu", "padded_mfu", "test_acc",
                "peak_rss_mb"))] for v, t in table.items()]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
