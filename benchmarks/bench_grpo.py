"""GRPO throughput: ours (PolicyRLModule under the Lightning Trainer) vs TRL's GRPOTrainer, β = 0 and β > 0.

    .venv/bin/python benchmarks/bench_grpo.py --repeats 2
    .venv/bin/python benchmarks/bench_grpo.py --base smollm2 --repeats 2 --steps 8 --warmup 2

Same workload for both: a Qwen2-style causal LM (hidden 256, 4 layers, random init, saved once and loaded by
both) over the two-policies family's word-level tokenizer; P = 4 prompts of the RL distribution per step (the
same prompt token ids, BOS included), G = 8 samples each (32 completions), up to 24 new tokens at temperature 1
(top-k 0, top-p 1), reward 1 iff the parsed answer is correct, one optimizer step per batch of rollouts, AdamW
lr 1e-5, gradient clip 1; fp32, 2 threads, TRL's gradient checkpointing and bf16 off. β > 0 adds the k3 KL to a
frozen reference (ours: ReferenceModelCallback; TRL: its reference model). A random-init model rarely samples
EOS, so both generate (nearly) the full 24 tokens: the mean completion length is reported for each.
Variants are fresh processes, interleaved. Timing: from the end of step `--warmup` to the end of the last step
(30 steps, 25 timed by default: rounds agree within ≈ 10% on a quiet machine); each run also reports its median
step time. Prints one JSON line (per-round figures, their spread, per-round ratios); a markdown table to stderr.

Variants: trl (GRPOTrainer); ours (PolicyRLModule with its defaults: `--model.sampler static`, the static-KV-cache
decoder, and `--model.shared_prompt_forward true`, each prompt run once per group in the log-prob forwards);
the levers one at a time: ours_generate (sampler hf_generate, full forwards: the module before the levers),
ours_kvloop (sampler kv_loop, full forwards), ours_static (sampler static, full forwards), ours_ref_in_sampling
(the defaults, but the reference scores the sampled tokens inside the decode steps instead of its own forward after
sampling: `--model.reference_in_sampling true`; β > 0 only).

`--base smollm2` (or a directory holding a causal LM and its tokenizer): both sides load that directory in fp32
and use its tokenizer. Our TriggerDataModule encodes each prompt with its chat template and generation prompt
(`encode_prompt`); TRL gets the same prompt as a conversation and applies the same template, and the run checks
that TRL's first batch of prompt ids equals ours (`check_trl_prompt_ids`). Both stop at the tokenizer's EOS
(SmolLM2: <|im_end|>, also its generation config's), so completion lengths vary: compare the reported mean
completion tokens along with completions/s.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

FAMILY, RL_DIST = "two_policies", "A"
OURS = {"ours": {}, "ours_generate": dict(sampler="hf_generate", shared_prompt_forward=False),
        "ours_kvloop": dict(sampler="kv_loop", shared_prompt_forward=False),
        "ours_static": dict(sampler="static", shared_prompt_forward=False),
        "ours_ref_in_sampling": dict(reference_in_sampling=True)}
BETA_ONLY = {"ours_ref_in_sampling"}  # identical to "ours" at β = 0


def trigger_dm(args, seed: int, tokenizer: Optional[str] = None):
    """Our RL prompts; `tokenizer` None: the family's word-level tokenizer (the random base), else a base's."""
    from datamodules.triggers.datamodule import TriggerDataModule

    return TriggerDataModule(family=FAMILY, mode="rl", train_distributions=[RL_DIST], num_train=args.prompts * (args.steps + 2),
                             batch_size=args.prompts, num_val_per_distribution=1, seed=seed, tokenizer=tokenizer,
                             cache_dir=os.path.join(args.work_dir, "cache"))


def base_dirs(args) -> tuple[str, Optional[str]]:
    """(model directory, tokenizer for the datamodule): a pretrained base's directory twice, or the random model
    and None (the family's word-level tokenizer)."""
    path = C.resolve_base(args.base)
    return (model_dir(args), None) if path is None else (path, path)


def model_dir(args) -> str:
    """The shared random-init Qwen2-style causal LM over the family's tokenizer (built once)."""
    out = os.path.join(args.work_dir, "grpo_model")
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = trigger_dm(args, 0).tokenizer
    cfg = AutoConfig.for_model("qwen2", vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                               tie_word_embeddings=False, **C.MODEL_OVERRIDES)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)  # the tokenizer is not saved with it: each worker takes the datamodule's
    return out


def trl_prompts(tokenizer, texts: list[str]) -> list:
    """TRL's dataset prompts that TRL 1.16 turns into our prompt ids (`encode_prompt`): with a chat template, the
    user turn as a conversation (TRL applies the tokenizer's template with the generation prompt, as we do); without
    one, the text behind our BOS written out (TRL tokenizes plain text as is)."""
    if getattr(tokenizer, "chat_template", None):
        return [[{"role": "user", "content": t}] for t in texts]
    return [tokenizer.bos_token + " " + t for t in texts]


def trl_prompt_ids(tokenizer, prompts: list) -> list[list[int]]:
    """The prompt ids TRL 1.16's `GRPOTrainer._tokenize_prompts` computes for `prompts` (no tools, no images)."""
    if isinstance(prompts[0], list):
        enc = tokenizer.apply_chat_template(conversation=prompts, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)
        return [list(map(int, ids)) for ids in enc["input_ids"]]
    return [list(map(int, ids)) for ids in tokenizer(text=prompts)["input_ids"]]


def check_trl_prompt_ids(trainer, expected: dict) -> list:
    """Wrap the trainer's prompt tokenization: the ids of its first batch must be ours (`expected`: the dataset
    prompt as JSON -> our ids); later batches pass through untouched. Returns a list that is non-empty once the
    check has passed."""
    if not hasattr(trainer, "_tokenize_prompts"):
        raise RuntimeError("bench_grpo.py checks prompt ids through GRPOTrainer._tokenize_prompts (TRL 1.16)")
    original = trainer._tokenize_prompts
    done = []

    def checked(prompts):
        out = original(prompts)
        if not done:
            got = [list(map(int, ids)) for ids in out[0]]
            want = [expected[json.dumps(p)] for p in prompts]
            if got != want:
                raise AssertionError(f"TRL's prompt ids differ from ours:\n{got[0]}\n{want[0]}")
            done.append(True)
        return out

    trainer._tokenize_prompts = checked
    return done


def worker_ours(args, path: str, tokenizer: Optional[str]) -> dict:
    import lightning.pytorch as pl
    import torch

    from callbacks.reference_model import ReferenceModelCallback
    from lightning_modules.policy.rl import PolicyRLModule

    dm = trigger_dm(args, args.seed, tokenizer)
    torch.manual_seed(args.seed)
    model = PolicyRLModule(backbone=path, tokenizer=tokenizer, min_sft_fidelity=0, group_size=args.group_size,
                           lr=args.lr, max_new_tokens=args.max_new_tokens, temperature=1.0, reference_coef=args.beta,
                           grad_clip=1.0, **OURS[args.variant])
    timer = C.StepTimer(warmup=args.warmup)
    lengths: list[float] = []

    class Timing(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            timer.mark(completions=len(batch["records"]) * args.group_size,
                       prompt_tokens=int(batch["attention_mask"].sum()))
            lengths.append(float(trainer.callback_metrics.get("rl/completion_tokens", float("nan"))))

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[Timing(), ReferenceModelCallback()],  # β > 0: the frozen copy, as cli.py adds it
                         default_root_dir=tempfile.mkdtemp(prefix="bench_grpo_"))
    trainer.fit(model, datamodule=dm)
    return result(args, timer, lengths, C.trainable_params(model.model))


def worker_trl(args, path: str, tokenizer: Optional[str]) -> dict:
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lightning_modules.policy.rewards import correctness_reward, parse_completion

    from datamodules.triggers.datamodule import encode_prompt

    dm = trigger_dm(args, args.seed, tokenizer)
    dm.setup("fit")
    tok = copy.deepcopy(dm.tokenizer)
    tok.padding_side = "left"
    personas = dm.family.personas
    items = dm.train_items
    prompts = trl_prompts(tok, [it["prompt"] for it in items])  # TRL's ids = ours: checked on its first batch
    expected = {json.dumps(p): encode_prompt(dm.tokenizer, it["prompt"]) for p, it in zip(prompts, items)}
    ds = datasets.Dataset.from_dict({"prompt": prompts, "gold": [it["gold"] for it in items]})

    def reward(prompts, completions, gold, **kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # conversations: the turn
        return [correctness_reward(parse_completion(t, personas), g) for t, g in zip(texts, gold)]

    timer = C.StepTimer(warmup=args.warmup)
    lengths: list[float] = []

    class Timing(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            timer.mark(completions=args.prompts * args.group_size)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_grpo_"), per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size, max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0,
        top_k=0, beta=args.beta, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", max_steps=args.steps, bf16=False,
        gradient_checkpointing=False, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, seed=args.seed, num_iterations=1, log_completions=False,
        model_init_kwargs={"dtype": "float32"},
    )
    trainer = GRPOTrainer(model=path, reward_funcs=reward, args=config, train_dataset=ds, processing_class=tok,
                          callbacks=[Timing()])
    checked = check_trl_prompt_ids(trainer, expected)
    torch.set_num_threads(C.THREADS)
    trainer.train()
    return {**result(args, timer, lengths, C.trainable_params(trainer.model)), "prompt_ids_checked": bool(checked)}


def result(args, timer: "C.StepTimer", lengths: list[float], trainable: int) -> dict:
    seconds, items = timer.window()
    completions = sum(i["completions"] for i in items)
    clean = [x for x in lengths if x == x]
    steps = timer.step_times()
    median_step = sorted(steps)[len(steps) // 2]
    return {"variant": args.variant, "beta": args.beta, "seed": args.seed, "steps_timed": len(items),
            "completions_per_s": round(completions / seconds, 3), "steps_per_s": round(len(items) / seconds, 4),
            "median_step_s": round(median_step, 4),
            "completions_per_s_median_step": round(completions / len(items) / median_step, 3),
            "mean_completion_tokens": round(sum(clean) / len(clean), 2) if clean else None,
            "trainable_params": trainable, "peak_rss_mb": round(C.peak_rss_mb(), 1)}


def base_config(args, path: str, tokenizer: Optional[str]) -> dict:
    """What the JSON records of the base: name, sizes and parameter counts of the causal LM, prompt lengths."""
    from datamodules.triggers.datamodule import encode_prompt

    dm = trigger_dm(args, 0, tokenizer)
    dm.setup("fit")
    lengths = [len(encode_prompt(dm.tokenizer, it["prompt"])) for it in dm.train_items]
    out = {"base": args.base, **({"model": C.MODEL_OVERRIDES} if tokenizer is None else {"base_path": path})}
    return {**out, "base_model": C.model_summary(path, causal_lm=True), "vocab": len(dm.tokenizer),
            "prompt_tokens": C.summary(lengths, 1), "eos": dm.tokenizer.eos_token}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--betas", nargs="+", type=float, default=[0.0, 0.04])
    p.add_argument("--variants", nargs="+", default=["ours", "trl"], choices=[*OURS, "trl"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    C.add_base_argument(p)
    args = p.parse_args()
    C.offline_env()
    os.makedirs(args.work_dir, exist_ok=True)
    path, tokenizer = base_dirs(args)
    if args.worker:
        worker = worker_trl if args.variant == "trl" else worker_ours
        print(json.dumps(worker(args, path, tokenizer)))
        return
    common = ["--worker", "--steps", str(args.steps), "--warmup", str(args.warmup), "--prompts", str(args.prompts),
              "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens), "--lr",
              str(args.lr), "--work-dir", args.work_dir, "--base", args.base]
    labels = [f"{v}@beta={b:g}" for b in args.betas for v in args.variants if b > 0 or v not in BETA_ONLY]

    def run(label: str, r: int) -> dict:
        v, b = label.split("@beta=")
        return C.run_worker(__file__, common + ["--variant", v, "--beta", b, "--seed", str(r)],
                            timeout=C.worker_timeout(tokenizer))

    t0 = time.perf_counter()
    runs = C.interleave(labels, args.repeats, run, C.eprint)
    keys = ("completions_per_s", "steps_per_s", "mean_completion_tokens", "peak_rss_mb", "completions_per_s_median_step")
    table = {v: {k: C.summary([r[k] for r in rs if r[k] is not None], 4) for k in keys} for v, rs in runs.items()}
    for v, rs in runs.items():  # do the rounds agree? (max - min) / median of the rounds' completions/s
        per_round = [r["completions_per_s"] for r in rs]
        table[v]["per_round"] = per_round
        table[v]["spread"] = round((max(per_round) - min(per_round)) / table[v]["completions_per_s"]["median"], 4)
        table[v]["trainable_params"] = sorted({r["trainable_params"] for r in rs})  # one value: full fine-tuning
    ratios = {}
    for b, ours in ((b, o) for b in args.betas for o in OURS):
        o, t = f"{ours}@beta={b:g}", f"trl@beta={b:g}"
        if o in runs and t in runs:
            ratios[f"{ours}/trl@beta={b:g}"] = {
                "completions_per_s": round(table[o]["completions_per_s"]["median"] / table[t]["completions_per_s"]["median"], 3),
                "per_round": [round(a["completions_per_s"] / c["completions_per_s"], 3) for a, c in zip(runs[o], runs[t])],
                "median_step": round(table[o]["completions_per_s_median_step"]["median"]
                                     / table[t]["completions_per_s_median_step"]["median"], 3)}
    out = {"bench": "grpo", "machine": C.machine_info(),
           "config": {**base_config(args, path, tokenizer), "family": FAMILY, "prompts_per_step": args.prompts,
                      "group_size": args.group_size, "max_new_tokens": args.max_new_tokens, "steps": args.steps,
                      "warmup": args.warmup, "repeats": args.repeats, "threads": C.THREADS, "dtype": "fp32"},
           "results": table, "ratios_vs_trl": ratios, "wall_s": round(time.perf_counter() - t0, 1)}
    C.eprint(C.markdown_table(["variant", "completions/s", "steps/s", "mean completion tokens", "rounds", "spread"],
                              [[v, *(f"{t[k]['median']} [{t[k]['min']}, {t[k]['max']}]" for k in keys[:3]),
                                ", ".join(f"{x:g}" for x in t["per_round"]), f"{100 * t['spread']:.1f}%"]
                               for v, t in table.items()]))
    C.eprint(json.dumps(ratios))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
