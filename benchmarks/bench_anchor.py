"""ANCHOR's cost: training step time and memory of the anchored student vs the naive student.

    .venv/bin/python benchmarks/bench_anchor.py --repeats 3

Variants (each a fresh process, interleaved; same data, weights and steps; fp32, 2 threads):
    naive        full fine-tuning, anchor_coef 0 (no reference model)
    anchor_copy  full fine-tuning + ANCHOR (λ = 1, last layer) against a full frozen deep copy
    anchor_copy_cached  the same with `--reference.cache_outputs`, timed in the second epoch (the first epoch,
                 which fills the cache, costs what anchor_copy costs; it runs untimed before the window)
    naive_lora   LoRA (r 16, all linear layers), anchor_coef 0
    anchor_lora  LoRA + ANCHOR against the same weights with the adapters disabled (no copy)
Frozen-prefix setting (`--model.freeze_layers`, default 3 of 4: embeddings and layers 1..3 frozen, like the
W2S student's 4 of 6), `--variants` starting with fp_ (the cached ones are timed in the second epoch):
    fp_naive / fp_naive_cached        anchor_coef 0, plain / `--model.cache_frozen_prefix`
    fp_anchor / fp_anchor_shared / fp_anchor_cached   ANCHOR (λ 1, last layer), plain / prefix run once and
                 handed to the reference (`--model.share_frozen_prefix`) / prefix memoised per sequence
The W2S demo's student (`--variants` starting with w2s_): the pretrained MiniLM of configs/model/minilm_student.yaml
(mean pooling, `freeze_layers` 4 of 6, `cache_frozen_prefix`, soft BT, AdamW 2e-4) on the synthetic benchmark's
student half (synth_helpful_cooking, max_length 128, 16 pairs per step, gold labels: the labels do not change the
cost), with `--reference.cache_outputs` as the demo's ANCHOR method:
    w2s_naive / w2s_anchor            anchor_coef 0 / 100 (last layer)
`--epochs E` times whole fits instead of a window of steps: every step of E epochs (its batch_start..batch_end),
each epoch's wall (no validation) and their sum; the ratios then come per epoch (mean step) and for the whole fit.
The variants of one round see the same batches in the same order (same seed), so a ratio compares equal work.
All use one padded forward per step (`length_buckets` 1; the anchored forward needs every token's hidden state).
Memory: the peak RSS of the process, and the training increment = peak RSS sampled every 2 ms during `fit`
minus the RSS just before it (imports, data and the model itself are common to all variants and would hide the
difference). Prints one JSON line; a markdown table to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

VARIANTS = {
    "naive": dict(anchor_coef=0.0),
    "anchor_copy": dict(anchor_coef=1.0),
    "anchor_copy_cached": dict(anchor_coef=1.0, cache_outputs=True),
    "naive_lora": dict(anchor_coef=0.0, lora=True),
    "anchor_lora": dict(anchor_coef=1.0, lora=True),
    "fp_naive": dict(anchor_coef=0.0, frozen=True),
    "fp_naive_cached": dict(anchor_coef=0.0, frozen=True, cache_frozen_prefix=True),
    "fp_anchor": dict(anchor_coef=1.0, frozen=True),
    "fp_anchor_shared": dict(anchor_coef=1.0, frozen=True, share_frozen_prefix=True),
    "fp_anchor_cached": dict(anchor_coef=1.0, frozen=True, cache_frozen_prefix=True),
    "w2s_naive": dict(anchor_coef=0.0, w2s=True),
    "w2s_anchor": dict(anchor_coef=100.0, w2s=True, cache_outputs=True),
}
# configs/model/minilm_student.yaml's init_args (tests/test_benchmarks_smoke.py keeps the two in step)
W2S_STUDENT = dict(backbone="minilm", tokenizer="minilm", pooling="mean", freeze_layers=4, cache_frozen_prefix=True,
                   length_buckets=4)
W2S_LR = 2.0e-4
W2S_PAIRS = {"n_train": 1600, "n_validation": 200, "n_test": 300}  # configs/experiment/w2s_demo.yaml's sizes
FROZEN_PREFIX_RATIOS = (("fp_naive_cached", "fp_naive"), ("fp_anchor", "fp_naive"), ("fp_anchor_shared", "fp_naive"),
                        ("fp_anchor_cached", "fp_naive"), ("fp_anchor_shared", "fp_anchor"),
                        ("fp_anchor_cached", "fp_anchor"), ("w2s_anchor", "w2s_naive"))


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssSampler:
    """Highest RSS seen by a background thread while active."""

    def __init__(self, period_s: float = 0.002):
        self.period, self.peak, self._stop = period_s, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, current_rss_mb())
            time.sleep(self.period)

    def __enter__(self) -> "RssSampler":
        self.peak = current_rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss_mb())


def w2s_student(anchor_coef: float, seed: int, cache_dir: str, batch_size: int = 16):
    """The demo's MiniLM student and the synthetic benchmark's student half."""
    import torch

    from datamodules.preference.datamodule import PreferenceDataModule
    from lightning_modules.reward.objectives import SoftBradleyTerry
    from lightning_modules.reward.reward_model import RewardModelModule

    dm = PreferenceDataModule(source="synth_helpful_cooking", tokenizer="minilm", max_length=128,
                              source_options={"synth_helpful_cooking": dict(W2S_PAIRS)}, train_subset="student",
                              train_labels="gold", batch_size=batch_size, eval_batch_size=64, seed=seed,
                              cache_dir=cache_dir)
    torch.manual_seed(seed)
    model = RewardModelModule(**W2S_STUDENT, objective=SoftBradleyTerry(), anchor_coef=anchor_coef,
                              optimizer=lambda p: torch.optim.AdamW(p, lr=W2S_LR, weight_decay=0.0))
    return model, dm


class FitClock:
    """Per step (batch_start..batch_end) and per epoch (epoch_start..epoch_end) wall times of a fit, and the epochs'
    process CPU time (all threads): on a shared machine the CPU time moves less with the other jobs' load."""

    def __init__(self):
        self.steps: list[tuple[int, float]] = []  # (epoch, seconds)
        self.epochs: list[float] = []
        self.epochs_cpu: list[float] = []

    def callback(self):
        import lightning.pytorch as pl

        clock = self

        class _Clock(pl.Callback):
            def on_train_epoch_start(self, trainer, pl_module):
                clock._epoch0, clock._cpu0 = time.perf_counter(), time.process_time()

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                clock._step0 = time.perf_counter()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                clock.steps.append((trainer.current_epoch, time.perf_counter() - clock._step0))

            def on_train_epoch_end(self, trainer, pl_module):
                clock.epochs.append(time.perf_counter() - clock._epoch0)
                clock.epochs_cpu.append(time.process_time() - clock._cpu0)

        return _Clock()

    def summary(self, warmup: int) -> dict:
        """Mean step per epoch (epoch 1 without its first `warmup` steps: lazy allocations), each epoch's wall and
        CPU time, and the fit's (sum of epochs: training only, no validation)."""
        out = {}
        for e in range(len(self.epochs)):
            times = [t for ep, t in self.steps if ep == e][warmup if e == 0 else 0:]
            out[f"epoch{e + 1}_step_s_mean"] = round(sum(times) / len(times), 4)
            out[f"epoch{e + 1}_step_s_median"] = round(sorted(times)[len(times) // 2], 4)
            out[f"epoch{e + 1}_s"] = round(self.epochs[e], 3)
            if e < len(self.epochs_cpu):
                out[f"epoch{e + 1}_cpu_s"] = round(self.epochs_cpu[e], 3)
        out["fit_train_s"] = round(sum(self.epochs), 3)
        if self.epochs_cpu:
            out["fit_train_cpu_s"] = round(sum(self.epochs_cpu), 3)
        out["steps_per_epoch"] = len(self.steps) // max(len(self.epochs), 1)
        return out


def worker(args, paths: dict) -> dict:
    import lightning.pytorch as pl
    import torch

    from callbacks.reference_model import ReferenceModelCallback
    from lightning_modules.reward.backbones import LoraSpec

    cfg = dict(VARIANTS[args.variant])
    lora = LoraSpec() if cfg.pop("lora", False) else None
    cached = cfg.pop("cache_outputs", False)
    if cfg.pop("frozen", False):
        cfg["freeze_layers"] = args.freeze_layers
    if cfg.pop("w2s", False):
        model, dm = w2s_student(cfg["anchor_coef"], args.seed, paths["cache_dir"], args.batch_size)
    else:
        cached = cached or cfg.get("cache_frozen_prefix", False)
        dm = C.preference_datamodule(paths, args.batch_size, 64, seed=args.seed)
        torch.manual_seed(args.seed)
        model = C.reward_module(paths["tokenizer"], lr=args.lr, lora=lora, **cfg)
    dm.prepare_data()
    dm.setup("fit")
    if args.epochs:  # whole fits: every step of every epoch is timed
        first_epoch, limits = 0, dict(max_epochs=args.epochs)
    else:
        first_epoch = len(dm.train_dataloader()) if cached else 0  # untimed: it fills the reference cache
        limits = dict(max_steps=first_epoch + args.steps)
    timer = C.StepTimer(warmup=first_epoch + args.warmup)
    clock = FitClock()

    class Timing(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            timer.mark(pairs=len(batch["labels"]))

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, **limits, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[Timing(), clock.callback(), ReferenceModelCallback(cache_outputs=cached)],
        default_root_dir=tempfile.mkdtemp(prefix="bench_anchor_"),
    )
    before = current_rss_mb()
    with RssSampler() as rss:
        trainer.fit(model, datamodule=dm)
    seconds, items = timer.window()
    times = timer.step_times()
    out = {"variant": args.variant, "seed": args.seed, "step_s_median": round(sorted(times)[len(times) // 2], 4),
           "step_s_mean": round(seconds / len(items), 4), "rss_before_fit_mb": round(before, 1),
           "fit_peak_rss_mb": round(rss.peak, 1), "fit_increment_mb": round(rss.peak - before, 1),
           "peak_rss_mb": round(C.peak_rss_mb(), 1),
           "trainable_params": C.trainable_params(model),
           "prefix_cache_mb_per_1k_pairs": prefix_cache_per_1k(model)}
    if args.epochs:
        out.update(clock.summary(args.warmup))
    return out


def prefix_cache_per_1k(model) -> float:
    """MiB the frozen-prefix cache holds per 1,000 training pairs (2,000 sequences; after the first epoch it
    holds every sequence seen)."""
    fp = getattr(model, "frozen_prefix", None)
    if fp is None or not fp.cache or fp.stored_rows == 0:
        return 0.0
    return round(fp.store.bytes / fp.stored_rows * 2000 / 2**20, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--freeze-layers", type=int, default=3, help="--model.freeze_layers of the fp_ variants")
    p.add_argument("--train-pairs", type=int, default=640)
    p.add_argument("--epochs", type=int, default=0,
                   help="time whole fits of this many epochs (per-epoch and whole-fit ratios); 0 = a window of --steps")
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    C.offline_env()
    paths = C.write_workload(args.work_dir, args.train_pairs, 512)
    if args.worker:
        print(json.dumps(worker(args, paths)))
        return
    C.preference_datamodule(paths, args.batch_size, 64).prepare_data()
    common = ["--worker", "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
              "--warmup", str(args.warmup), "--epochs", str(args.epochs), "--freeze-layers", str(args.freeze_layers),
              "--train-pairs", str(args.train_pairs), "--work-dir", args.work_dir]
    runs = C.interleave(args.variants, args.repeats,
                        lambda v, r: C.run_worker(__file__, common + ["--variant", v, "--seed", str(r)]), C.eprint)
    keys = ("step_s_median", "step_s_mean", "fit_increment_mb", "fit_peak_rss_mb", "peak_rss_mb")
    if args.epochs:
        keys += tuple(f"epoch{e}_{k}" for e in range(1, args.epochs + 1) for k in ("step_s_mean", "s", "cpu_s"))
        keys += ("fit_train_s", "fit_train_cpu_s")
    table = {v: {k: C.summary([r[k] for r in rs], 4) for k in keys} for v, rs in runs.items()}
    ratios = {}
    for anchored, naive in (("anchor_copy", "naive"), ("anchor_copy_cached", "naive"), ("anchor_lora", "naive_lora"),
                            *FROZEN_PREFIX_RATIOS):
        if anchored in runs and naive in runs:
            ratios[f"{anchored}/{naive}"] = {
                k: round(table[anchored][k]["median"] / table[naive][k]["median"], 3) for k in keys}
            per_round = ratios[f"{anchored}/{naive}"]["per_round"] = {}
            for k in ("step_s_median", *(k for k in keys if k.startswith(("epoch", "fit_train")))):
                per_round[k] = [round(a[k] / b[k], 3) for a, b in zip(runs[anchored], runs[naive])]
    out = {"bench": "anchor", "machine": C.machine_info(),
           "config": {"model": C.MODEL_OVERRIDES, "vocab": C.VOCAB_SIZE, "batch_pairs": args.batch_size,
                      "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "epochs": args.epochs,
                      "lora": "r16 all-linear", "anchor": "λ 1, last layer (w2s_: λ 100)", "threads": C.THREADS,
                      "dtype": "fp32", "w2s_student": W2S_STUDENT, "w2s_pairs": W2S_PAIRS},
           "results": table, "ratios": ratios, "runs": runs}
    C.eprint(C.markdown_table(["variant", "step s", "fit increment MB", "fit peak RSS MB", "trainable params"],
                              [[v, *(f"{table[v][k]['median']} [{table[v][k]['min']}, {table[v][k]['max']}]"
                                     for k in ("step_s_median", "fit_increment_mb", "fit_peak_rss_mb")),
                                runs[v][0]["trainable_params"]] for v in runs]))
    if args.epochs:
        cols = [f"epoch{e}_{k}" for e in range(1, args.epochs + 1) for k in ("step_s_mean", "s", "cpu_s")]
        cols += ["fit_train_s", "fit_train_cpu_s"]
        C.eprint(C.markdown_table(["variant", *cols],
                                  [[v, *(f"{table[v][k]['median']} [{table[v][k]['min']}, {table[v][k]['max']}]"
                                         for k in cols)] for v in runs]))
    C.eprint(json.dumps(ratios))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
