"""Cost probe (not a test): one GRPO step of SmolLM2-135M-Instruct with and without LoRA, β > 0.

    .venv/bin/python benchmarks/bench_policy_lora.py [--steps 2] [--warmup 1] [--beta 0.04]

The workload is the two-policy RL stage as `configs/mixture/cpu/smollm2_rl{,_lora}.yaml` sizes it on CPU (fp32,
2 prompts x group 8 = 16 rollouts of up to 24 tokens, shared-prompt log-probs), run by the Trainer from the
pretrained model (no SFT checkpoint: `min_sft_fidelity 0`; the cost does not depend on the weights), with a KL
term so that the reference exists: a frozen deep copy under full fine-tuning, the base with adapters disabled under
LoRA. Each variant runs in its own worker process (peak RSS per run): `--warmup` untimed steps, then `--steps`
timed ones, the sampling's share timed apart (LoRA samples with kv_loop: the static decoder cannot run adapters).
The parent prints one JSON line: trainable parameters, the reference's extra parameters, optimizer state, seconds
per step and per sampling (median), peak RSS, the machine and its load. ~4 min on 2 busy cores; under load the
times vary by 2x and more, the parameter and memory counts do not.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

VARIANTS = ("full", "lora")
LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}  # cpu/smollm2_rl_lora.yaml's


def worker(variant: str, steps: int, warmup: int, beta: float, work_dir: str) -> dict:
    import lightning as L
    import torch

    from callbacks.reference_model import ReferenceModelCallback
    from datamodules.triggers.datamodule import TriggerDataModule
    from lightning_modules.policy.lora import trainable_parameters
    from lightning_modules.policy.rl import PolicyRLModule

    L.seed_everything(0)
    dm = TriggerDataModule(family="two_policies", mode="rl", train_distributions=["A"], tokenizer="smollm2",
                           num_train=2 * (steps + warmup), batch_size=2, num_val_per_distribution=2,
                           cache_dir=os.path.join(work_dir, "cache"))
    module = PolicyRLModule(backbone="smollm2", tokenizer="smollm2", lr=3e-4 if variant == "lora" else 3e-5,
                            group_size=8, max_new_tokens=24, min_sft_fidelity=0.0, reference_coef=beta,
                            lora=LORA if variant == "lora" else None)
    ref_cb = ReferenceModelCallback()
    sampling: list[float] = []
    steps_s: list[float] = []
    facts: dict = {}

    class Clock(L.Callback):
        def on_train_start(self, trainer, pl_module):
            inner = pl_module.sample

            def timed(*a, **k):
                t0 = time.perf_counter()
                out = inner(*a, **k)
                sampling.append(time.perf_counter() - t0)
                return out

            pl_module.sample = timed
            opt = trainer.optimizers[0]
            facts.update(trainable=trainable_parameters(pl_module.model),
                         parameters=sum(p.numel() for p in pl_module.model.parameters()),
                         optimizer_tensors=sum(p.numel() for g in opt.param_groups for p in g["params"]),
                         reference_mode=ref_cb.reference.mode,
                         reference_extra_parameters=ref_cb.reference.parameter_count(),
                         sampler=pl_module.effective_sampler())

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            steps_s.append(time.perf_counter() - self.t0)

    trainer = L.Trainer(max_steps=warmup + steps, accelerator="cpu", devices=1, precision=32, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[ref_cb, Clock()])
    trainer.fit(module, dm)
    # AdamW keeps two fp32 moments per trained parameter (the gradients are as many again)
    return {"variant": variant, **facts, "optimizer_state_mb": round(2 * 4 * facts["optimizer_tensors"] / 2**20, 1),
            "seconds_per_step": C.summary(steps_s[warmup:]), "sampling_seconds": C.summary(sampling[warmup:]),
            "peak_rss_mb": round(C.peak_rss_mb(), 1), "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--worker", choices=VARIANTS, default=None)
    args = parser.parse_args()
    C.offline_env()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.warmup, args.beta, args.work_dir)))
        return
    import tempfile

    from datamodules.tokenizers import resolve_pretrained

    resolve_pretrained("smollm2")  # convert (once) here, not inside a timed worker
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="bench_policy_lora_")
    results = {}
    for variant in VARIANTS:
        results[variant] = C.run_worker(os.path.abspath(__file__), [
            f"--worker={variant}", f"--steps={args.steps}", f"--warmup={args.warmup}", f"--beta={args.beta}",
            f"--work_dir={work_dir}"], timeout=C.PRETRAINED_WORKER_TIMEOUT)
        C.eprint(variant, json.dumps(results[variant]))
    full, lora = results["full"], results["lora"]
    print(json.dumps({"bench": "policy_lora", "beta": args.beta, "machine": C.machine_info(),
                      "trainable_share_lora": round(lora["trainable"] / lora["parameters"], 4),
                      "peak_rss_lora_over_full": round(lora["peak_rss_mb"] / full["peak_rss_mb"], 3),
                      "step_lora_over_full": round(lora["seconds_per_step"]["median"]
                                                   / full["seconds_per_step"]["median"], 3),
                      "results": results}))


if __name__ == "__main__":
    main()
