"""Where a seed of the W2S protocol with the SmolLM2 student (configs/experiment/w2s_smollm2*.yaml) spends its time.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_smollm2_w2s.py \\
        [--configs configs/experiment/w2s_smollm2.yaml configs/experiment/w2s_smollm2_advice.yaml] \\
        [--freeze 24 28] [--train-batches 5] [--val-batches 1] [--threads 1]

Everything runs through the project's own code: the protocol plans the config's stages (`protocols.w2s.protocol.parse`,
`plan_stages`), and each measured fit is `cli.py fit` with the `naive` stage's arguments (the config's trainer, data
and student files, seed, student half, student_args), gold labels (no teacher is trained here: a label's value
changes no cost), `--model.freeze_layers k`, one epoch limited to `--train-batches` batches and `--val-batches`
validation batches, no logger, and a clock callback (`StageClock`). The drift callback is left out (its cost is
estimated below from the evaluation rate).
  (a) Lengths: every split of the first config's student side (student half, validation, each test split) tokenized
      with SmolLM2's tokenizer (ChatML template, its default system prompt included) at the config's max_length:
      tokens per sequence (mean / max), response tokens, sequences at max_length, the template's own tokens;
      and the same for every other config given (the advice benchmark).
  (b) The frozen-prefix store at freeze_layers k (one worker process per k): the first fit computes hidden state k
      for its sequences (`FrozenPrefix._compute`, timed inside the fit); seconds per 1,000 real tokens, bytes per
      token held, RSS before/peak; extrapolated to every sequence of the seed (what the protocol builds once).
  (c) In the same process, over the store (the protocol's later stages read it too): seconds per training token
      with the top 30-k layers trainable for naive (= confidence, BSR: a loss on the rewards only), ANCHOR (λ 100,
      `--reference.cache_outputs`: the first epoch runs the reference's upper layers; later epochs read its cache),
      GRM sft and GRM dpo (the LM head over response tokens; dpo also the reference's); a validation pass's seconds
      per token (= a test pass's), a checkpoint save, and each `cli.py fit` / `cli.py test` call's fixed overhead
      (building the model and data module, loading a checkpoint).
The rates then price every student stage of each config's first seed (`estimate`: fits x epochs, validations, test
passes, WiSE-FT's validate + test, drift probes, checkpoint saves, the prefix store once) plus the teacher side
(`--teacher-seconds`, default from the MiniLM teacher search's fit_seconds in runs/w2s_small_vocab: 77-79 s, plus its
test and the weak labels) and two constants an end-to-end smoke measured (`SEED_SETUP_S`, `GRM_EXTRA_S`); the smoke's
other stages were priced within 5 s of their wall time. `--rates FILE` prices configs again from an earlier run's
JSON line without measuring (seconds). Prints one JSON line; a markdown summary to stderr. The figures depend on the
data only through token counts. About 14 minutes at 1 thread on a busy core.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning.pytorch as pl  # noqa: E402

from benchmarks import common as C  # noqa: E402

CONFIGS = ["configs/experiment/w2s_smollm2.yaml", "configs/experiment/w2s_smollm2_advice.yaml"]
# The measured variants: extra `cli.py fit` flags (the method rows of configs/experiment/w2s_smollm2*.yaml).
VARIANTS = {
    "naive": [],
    "anchor": ["--model.anchor_coef=100.0", "--reference.cache_outputs=true"],
    "grm_sft": ["--model.grm_coef=0.01", "--model.grm_form=sft"],
    "grm_dpo": ["--model.grm_coef=0.01", "--model.grm_form=dpo"],
}
DRIFT_FLAG = "--trainer.callbacks+=callbacks.drift.DriftDiagnosticsCallback"
DRIFT_PROBE_PAIRS = 64  # callbacks/drift.py's default: per probe split (ID validation + each OOD test split)
TEACHER_SECONDS = 180.0  # teacher search (77-79 s measured) + its test + the weak-label pass, rounded up
# What the rates leave out, measured by an end-to-end smoke of configs/experiment/w2s_smollm2.yaml at tiny sizes (every
# other stage was priced within 5 s of its wall time): the seed's first student stage (tokenizing for SmolLM2, the
# teacher's weak labels, the model directory's checks) and each GRM stage (the causal LM with its head, a larger
# checkpoint).
SEED_SETUP_S, GRM_EXTRA_S = 45.0, 16.0
RECORD: dict[str, Any] = {}  # what StageClock measured in this process (read by the worker)


# ---- the clock, a Lightning callback given to `cli.py fit` -----------------------------------------------------
class StageClock(pl.Callback):
    """Wall time of every training step and validation / test epoch, the seconds spent computing the frozen prefix
    inside each (its `_compute` wrapped), and the real / processed tokens of each batch, into `RECORD`."""

    def setup(self, trainer, pl_module, stage):
        fp = getattr(pl_module, "frozen_prefix", None)
        if fp is not None and not getattr(fp._compute, "_timed", False):
            inner = fp._compute

            def timed(ids, mask):
                t0 = time.perf_counter()
                out = inner(ids, mask)
                RECORD["prefix_s"] = RECORD.get("prefix_s", 0.0) + time.perf_counter() - t0
                RECORD["prefix_tokens"] = RECORD.get("prefix_tokens", 0) + int(mask.sum())
                return out

            timed._timed = True
            fp._compute = timed
        RECORD.setdefault("steps", [])
        RECORD.setdefault("evals", [])

    def _start(self, tokens=(0, 0)):
        self._t0, self._p0, self._tok = time.perf_counter(), RECORD.get("prefix_s", 0.0), list(tokens)

    def _stop(self) -> dict:
        return {"s": time.perf_counter() - self._t0, "prefix_s": RECORD.get("prefix_s", 0.0) - self._p0,
                "real": self._tok[0], "positions": self._tok[1]}

    def _count(self, batch) -> None:
        self._tok[0] += int(batch["attention_mask"].sum())
        self._tok[1] += batch["attention_mask"].numel()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start()
        self._count(batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        logged = {k: round(float(v), 6) for k, v in trainer.callback_metrics.items()
                  if k in ("train/pref_loss", "train/anchor_loss", "train/grm_reg")}
        RECORD["steps"].append({**self._stop(), **logged})

    # an evaluation pass, validation or test: the same clock, the kind read from the trainer's state
    def on_validation_epoch_start(self, trainer, pl_module):
        self._start()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._count(batch)

    def on_validation_epoch_end(self, trainer, pl_module):
        RECORD["evals"].append({"kind": "test" if trainer.testing else "validation", **self._stop()})

    on_test_epoch_start = on_validation_epoch_start
    on_test_batch_start = on_validation_batch_start
    on_test_epoch_end = on_validation_epoch_end


# ---- the protocol's own stages ---------------------------------------------------------------------------------
def plan(config: str):
    from protocols.w2s.protocol import parse
    from protocols.w2s.stages import plan_stages

    p = parse(["--config", config])
    return p, [s for s in plan_stages(p) if s.seed == p.seeds[0]]


def resolved(stage) -> dict:
    from protocols.engine.stage_identity import resolve_cli_config

    return resolve_cli_config(stage.args + stage.location_args("fit"))


def naive_args(config: str) -> list[str]:
    """The `naive` stage's `cli.py` arguments (first seed) without the drift callback."""
    _, stages = plan(config)
    stage = next((s for s in stages if s.name == "naive"), None)
    if stage is None:
        raise ValueError(f"{config}: the benchmark measures the stage of a method named 'naive'; the config has none")
    return [a for a in stage.args if a != DRIFT_FLAG]


# ---- (a) lengths -----------------------------------------------------------------------------------------------
def data_lengths(config: str, cache_dir: str) -> dict:
    """Tokens per sequence of every split the student side of `config` reads (first seed), as the protocol builds
    it: the `naive` stage's data options, its tokenizer (the student's)."""
    from datamodules.preference.datamodule import PreferenceDataModule
    from datamodules.preference.pair_tokenization import render_prompt

    _, stages = plan(config)
    cfg = resolved(next(s for s in stages if s.name == "naive"))
    init = dict(cfg["data"]["init_args"])
    init.update(train_labels="gold", teacher_checkpoint=None, cache_dir=cache_dir)
    dm = PreferenceDataModule(**init)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    tok = dm.tokenizer
    template = len(tok(render_prompt(tok, [{"role": "user", "content": ""}]), add_special_tokens=False)["input_ids"])
    splits, total = {}, {"sequences": 0, "tokens": 0}
    for name, ds in dm.datasets.items():
        if name == "train_teacher":
            continue
        seqs = [ids for side in "ab" for ids in ds.cols[f"{side}_input_ids"]]
        resp = [len(ids) - s for side in "ab" for ids, s in zip(ds.cols[f"{side}_input_ids"],
                                                                ds.cols[f"{side}_response_start"])]
        lengths = [len(s) for s in seqs]
        splits[name] = {"pairs": len(ds), "sequences": len(seqs), "tokens": sum(lengths),
                        "mean": round(sum(lengths) / len(lengths), 1), "max": max(lengths), "min": min(lengths),
                        "response_mean": round(sum(resp) / len(resp), 1),
                        "at_max_length": sum(n >= init["max_length"] for n in lengths)}
        total["sequences"] += len(seqs)
        total["tokens"] += sum(lengths)
    return {"config": config, "source": init["source"], "max_length": init["max_length"],
            "tokenizer": init["tokenizer"], "chat_template_tokens_empty_user_turn": template, "splits": splits,
            "total": total, "truncation": dm.manifest.get("truncation")}


# ---- ANCHOR's scale: the anchored hidden states at initialisation ------------------------------------------------
def hidden_scale(config: str, model_config: str, cache_dir: str, pairs: int = 16) -> dict:
    """Mean square per unit of the last layer's hidden states (the anchored layer; a decoder's after its final norm)
    over the response tokens of the first training batch of `config`'s student half, at the pretrained weights of
    `model_config`'s backbone. ANCHOR's term is λ·mean((h − h_ref)²) per unit: for the same relative drift it
    scales with this, so the ratio of two backbones' values carries a λ grid from one to the other (train split
    only: no label, validation or test pair is read)."""
    import torch
    import yaml

    from datamodules.preference.datamodule import PreferenceDataModule
    from lightning_modules.reward.reward_model import RewardModelModule

    _, stages = plan(config)
    init = dict(resolved(next(s for s in stages if s.name == "naive"))["data"]["init_args"])
    with open(model_config, encoding="utf-8") as f:
        m = yaml.safe_load(f)["model"]["init_args"]
    init.update(train_labels="gold", teacher_checkpoint=None, cache_dir=cache_dir, tokenizer=m["tokenizer"],
                batch_size=pairs)
    dm = PreferenceDataModule(**init)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    model = RewardModelModule(backbone=m["backbone"], tokenizer=m["tokenizer"], pooling=m["pooling"],
                              dtype=m.get("dtype", "float32")).eval()
    with torch.no_grad():
        _, hidden = model(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
    h = hidden[-1][batch["response_mask"].bool()]  # (response tokens, H)
    return {"backbone": m["backbone"], "response_tokens": int(h.shape[0]), "hidden": int(h.shape[1]),
            "mean_square": round(float(h.pow(2).mean()), 4), "unit_variance": round(float(h.var(0).mean()), 4)}


# ---- (b) + (c): one worker per freeze_layers -------------------------------------------------------------------
def worker(args) -> dict:
    import torch

    from benchmarks.bench_anchor import RssSampler, current_rss_mb
    from cli import main as cli_main
    import benchmarks.bench_smollm2_w2s as me  # the module the callback lives in (this file runs as __main__)

    torch.set_num_threads(args.threads)
    root = tempfile.mkdtemp(prefix=f"fit-k{args.freeze_layers}-", dir=args.work_dir)
    base = naive_args(args.configs[0]) + [
        "--data.train_labels=gold", f"--data.cache_dir={os.path.join(args.work_dir, 'cache')}",
        f"--model.freeze_layers={args.freeze_layers}", "--trainer.max_epochs=1",
        f"--trainer.limit_train_batches={args.train_batches}", f"--trainer.limit_val_batches={args.val_batches}",
        "--trainer.logger=false", "--trainer.enable_model_summary=false",
        "--trainer.callbacks+=benchmarks.bench_smollm2_w2s.StageClock"]
    fits, rss_before = [], current_rss_mb()
    ckpt = None
    order = ["naive", *args.variants]  # the first naive fit fills the store; the rest read it
    with RssSampler() as rss:
        for i, variant in enumerate(order):
            me.RECORD.clear()
            t0 = time.perf_counter()
            fit = cli_main(["fit", *base, *VARIANTS[variant], f"--trainer.default_root_dir={root}/{i}-{variant}"])
            wall = time.perf_counter() - t0
            rec = dict(me.RECORD)
            steps, evals = rec["steps"][1:], rec["evals"]  # the first step: lazy allocations
            train_s = sum(s["s"] - s["prefix_s"] for s in steps)
            out = {"variant": variant, "fills_store": i == 0, "wall_s": round(wall, 2),
                   "steps_timed": len(steps), "train_real_tokens": sum(s["real"] for s in steps),
                   "train_positions": sum(s["positions"] for s in steps),
                   "train_s_over_store": round(train_s, 3),
                   "train_s_per_1k_tokens": round(1000 * train_s / max(1, sum(s["real"] for s in steps)), 4),
                   "all_steps_s": round(sum(s["s"] for s in rec["steps"]), 3),
                   "validation": evals,
                   "prefix_s": round(rec.get("prefix_s", 0.0), 3), "prefix_tokens": rec.get("prefix_tokens", 0)}
            out["other_s"] = round(wall - out["all_steps_s"] - sum(e["s"] for e in evals), 2)
            if variant == "anchor":  # the drift's scale under training (train split only): where λ·L_anchor meets L
                out["losses"] = [{k: v for k, v in st.items() if k.startswith("train/")} for st in rec["steps"]]
            if i == 0:
                out["store_rows"] = fit.model.frozen_prefix.stored_rows
                out["store_mb"] = round(fit.model.frozen_prefix.store.bytes / 2**20, 2)
                out["rss_after_fill_mb"] = round(current_rss_mb(), 1)
                ckpt = fit.trainer.checkpoint_callback.best_model_path
                t1 = time.perf_counter()
                fit.trainer.save_checkpoint(os.path.join(root, "timed.ckpt"))
                out["checkpoint_save_s"] = round(time.perf_counter() - t1, 2)
                out["checkpoint_mb"] = round(os.path.getsize(os.path.join(root, "timed.ckpt")) / 2**20, 1)
            fits.append(out)
            del fit
        # a `cli.py test` call's fixed cost: model + data module + checkpoint load, 1 tiny batch per split
        me.RECORD.clear()
        t0 = time.perf_counter()
        cli_main(["test", *base, f"--ckpt_path={ckpt}", "--trainer.limit_test_batches=1", "--data.eval_batch_size=2",
                  f"--trainer.default_root_dir={root}/test", "--verbose=false"])
        test_wall = time.perf_counter() - t0
        test_evals = me.RECORD.get("evals", [])
    shutil.rmtree(root, ignore_errors=True)
    first = fits[0]
    prefix_rate = first["prefix_s"] / max(1, first["prefix_tokens"])
    over_store = [e for f in fits[1:] for e in f["validation"] if e["prefix_s"] < 0.05 * e["s"]]
    eval_s = sum(e["s"] - e["prefix_s"] for e in over_store)
    eval_tokens = sum(e["real"] for e in over_store)
    return {"freeze_layers": args.freeze_layers, "trainable_layers": 30 - args.freeze_layers,
            "threads": args.threads, "machine": C.machine_info(),
            "prefix": {"s_per_1k_tokens": round(1000 * prefix_rate, 4), "tokens": first["prefix_tokens"],
                       "seconds": first["prefix_s"], "store_rows": first["store_rows"], "store_mb": first["store_mb"],
                       "bytes_per_token": round(first["store_mb"] * 2**20 / max(1, first["prefix_tokens"]), 1),
                       "rss_before_mb": round(rss_before, 1), "rss_after_fill_mb": first["rss_after_fill_mb"]},
            "train_s_per_1k_tokens": {f["variant"]: f["train_s_per_1k_tokens"] for f in fits[1:]},
            "eval_s_per_1k_tokens": round(1000 * eval_s / max(1, eval_tokens), 4),
            "checkpoint_save_s": first["checkpoint_save_s"], "checkpoint_mb": first["checkpoint_mb"],
            "fit_overhead_s": round(sorted(f["other_s"] for f in fits[1:])[len(fits[1:]) // 2], 2),
            "test_call_s": round(test_wall - sum(e["s"] for e in test_evals), 2),
            "anchor_losses": next((f["losses"] for f in fits if "losses" in f), None),
            "peak_rss_mb": round(rss.peak, 1), "fits": fits}


# ---- the cost of a config's seed from the rates ----------------------------------------------------------------
def _float(v, default):
    return default if v is None else float(v)


def estimate(config: str, lengths: dict, rates: dict[int, dict], teacher_s: float) -> dict:
    """Seconds of the first seed of `config`, stage by stage, from the measured rates at its freeze_layers."""
    p, stages = plan(config)
    splits = lengths["splits"]
    tokens = lambda name: splits[name]["tokens"]  # noqa: E731
    t_train = tokens("train_student")
    t_val = tokens("validation")
    t_test = sum(v["tokens"] for k, v in splits.items() if k.startswith("test/"))
    per_seq = t_test / sum(v["sequences"] for k, v in splits.items() if k.startswith("test/"))
    t_probe = 2 * DRIFT_PROBE_PAIRS * per_seq * len([k for k in splits if k.startswith("test/")])  # val + OOD tests
    rows, k_seen = [], set()
    for stage in stages:
        if stage.is_teacher:
            continue
        cfg = resolved(stage)
        m, tr = cfg["model"]["init_args"], cfg["trainer"]
        k = m["freeze_layers"]
        if k not in rates:
            raise ValueError(f"{config}: stage {stage.name} freezes {k} layers; measured: {sorted(rates)}")
        r = rates[k]
        k_seen.add(k)
        ev = r["eval_s_per_1k_tokens"] / 1000
        drift = DRIFT_FLAG in stage.args
        if stage.evaluates or stage.combine:  # validate + test of another stage's checkpoint
            s = 2 * r["test_call_s"] + (t_val + t_test) * ev
            rows.append({"stage": stage.name, "kind": "evaluate", "seconds": round(s, 1)})
            continue
        epochs = int(tr.get("max_epochs") or 1)
        vci = tr.get("val_check_interval") or 1.0
        steps = -(-splits["train_student"]["pairs"] // cfg["data"]["init_args"]["batch_size"])
        per_epoch_vals = int(1 / float(vci)) if isinstance(vci, float) and vci <= 1 else max(1, steps // int(vci))
        n_val = epochs * per_epoch_vals
        if m.get("grm_coef", 0) > 0:
            kind = "grm_dpo" if m.get("grm_form") == "dpo" else "grm_sft"
            train = epochs * t_train * r["train_s_per_1k_tokens"][kind] / 1000 + GRM_EXTRA_S
        elif m.get("anchor_coef", 0) > 0:
            train = t_train * (r["train_s_per_1k_tokens"]["anchor"]
                               + (epochs - 1) * r["train_s_per_1k_tokens"]["naive"]) / 1000
            kind = "anchor"
        else:
            kind = "naive"
            train = epochs * t_train * r["train_s_per_1k_tokens"]["naive"] / 1000
        best = stage.checkpoint == "best"
        saves = n_val * (2 if best else 1) + (0 if best else 1)  # last (+ best) per validation; final.ckpt
        extra_test = 1 if best else 0  # the weak_val rule's checkpoint, tested when it differs (worst case)
        fixed = max(0.0, r["fit_overhead_s"] - 2 * r["checkpoint_save_s"])  # measured with its 2 saves (best, last)
        s = (train + n_val * t_val * ev + (1 + extra_test) * t_test * ev + saves * r["checkpoint_save_s"]
             + fixed + (1 + extra_test) * r["test_call_s"]
             + (((1 + n_val) * t_probe * ev + t_probe * ev) if drift else 0.0))
        rows.append({"stage": stage.name, "kind": kind, "freeze_layers": k, "epochs": epochs, "validations": n_val,
                     "drift": drift, "seconds": round(s, 1)})
    prefix = sum((t_train + t_val + t_test) * rates[k]["prefix"]["s_per_1k_tokens"] / 1000 for k in k_seen)
    students = sum(r["seconds"] for r in rows)
    total = students + prefix + teacher_s + SEED_SETUP_S
    return {"config": config, "seed": p.seeds[0], "seeds": len(p.seeds), "tokens": {
        "train_student": t_train, "validation": t_val, "tests": t_test},
        "prefix_store_s": round(prefix, 1),
        "prefix_store_mb": round((t_train + t_val + t_test) * 576 * 4 / 2**20, 1),
        "teacher_side_s": teacher_s, "seed_setup_s": SEED_SETUP_S, "students_s": round(students, 1), "stages": rows,
        "seed_minutes": round(total / 60, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=CONFIGS,
                   help="W2S configs; the first one's student side is measured, each one is priced")
    p.add_argument("--freeze", nargs="+", type=int, default=[24, 28], help="--model.freeze_layers values measured")
    p.add_argument("--variants", nargs="+", default=["naive", "anchor", "grm_sft", "grm_dpo"], choices=list(VARIANTS))
    p.add_argument("--train-batches", type=int, default=5, help="training batches per measured fit (first untimed)")
    p.add_argument("--val-batches", type=int, default=1, help="validation batches per measured fit")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: one core, as the sizing assumes)")
    p.add_argument("--teacher-seconds", type=float, default=TEACHER_SECONDS)
    p.add_argument("--rates", help="a previous run's JSON line: reuse its rates (no worker), price --configs again")
    p.add_argument("--work-dir", default=os.path.join("runs", "probe_smollm2_w2s", "bench"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--freeze-layers", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = os.environ["BENCH_THREADS"] = str(args.threads)  # and the workers'
    C.offline_env()
    import torch

    torch.set_num_threads(args.threads)
    os.chdir(C.ROOT)  # the configs name their files relative to the repository
    os.makedirs(args.work_dir, exist_ok=True)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    from datamodules.tokenizers import resolve_pretrained

    resolve_pretrained("smollm2")  # convert (once) here, not inside a timed worker
    load0 = os.getloadavg()
    cache = os.path.join(args.work_dir, "cache")
    lengths = {c: data_lengths(c, cache) for c in args.configs}
    previous = None
    if args.rates:
        with open(args.rates, encoding="utf-8") as f:
            previous = json.loads(f.read().strip().splitlines()[-1])
    scales = previous["hidden_scale"] if previous else {
        name: hidden_scale(args.configs[0], path, cache) for name, path in
        (("minilm", "configs/model/minilm_student.yaml"), ("smollm2", "configs/model/smollm2_student.yaml"))}
    scales["minilm_over_smollm2"] = round(scales["minilm"]["mean_square"] / scales["smollm2"]["mean_square"], 5)
    C.eprint("hidden scale:", json.dumps(scales))
    common = ["--worker", "--configs", *args.configs, "--variants", *args.variants, "--train-batches",
              str(args.train_batches), "--val-batches", str(args.val_batches), "--threads", str(args.threads),
              "--work-dir", args.work_dir]
    rates = {int(k): v for k, v in previous["rates"].items()} if previous else {}
    for k in ([] if previous else args.freeze):
        rates[k] = C.run_worker(os.path.abspath(__file__), common + ["--freeze-layers", str(k)],
                                timeout=C.PRETRAINED_WORKER_TIMEOUT)
        C.eprint(f"freeze {k}:", json.dumps({x: v for x, v in rates[k].items() if x != "fits"}))
    first = lengths[args.configs[0]]
    seed_store = {k: round((first["total"]["tokens"]) * rates[k]["prefix"]["s_per_1k_tokens"] / 1000, 1)
                  for k in rates}
    estimates = {}
    for c in args.configs:
        try:
            estimates[c] = estimate(c, lengths[c], rates, args.teacher_seconds)
        except ValueError as err:
            estimates[c] = {"error": str(err)}
    out = {"bench": "smollm2_w2s", "threads": args.threads, "machine": C.machine_info(),
           "loadavg_at_start": [round(x, 2) for x in load0], "lengths": lengths, "hidden_scale": scales,
           "rates": rates, "rates_from": args.rates,
           "store_build_s_whole_seed": seed_store, "estimates": estimates}
    rows = [[k, r["prefix"]["s_per_1k_tokens"], seed_store[k], r["prefix"]["bytes_per_token"],
             *(r["train_s_per_1k_tokens"].get(v, "") for v in ("naive", "anchor", "grm_sft", "grm_dpo")),
             r["eval_s_per_1k_tokens"], r["checkpoint_save_s"], r["fit_overhead_s"], r["test_call_s"],
             r["peak_rss_mb"]] for k, r in rates.items()]
    C.eprint(C.markdown_table(["freeze", "prefix s/1k tok", "store build s (seed)", "B/token", "naive s/1k",
                               "anchor s/1k", "grm_sft s/1k", "grm_dpo s/1k", "eval s/1k", "ckpt save s",
                               "fit overhead s", "test call s", "peak RSS MB"], rows))
    for c, e in estimates.items():
        C.eprint(c, json.dumps({k: v for k, v in e.items() if k != "stages"}))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
