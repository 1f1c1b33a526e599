"""Rollout sampling alone: the GRPO module's samplers (`--model.sampler` static, kv_loop, hf_generate), tokens/s.

    .venv/bin/python benchmarks/bench_sampler.py --base smollm2 --prompts 2 --group-size 4 --max-new-tokens 32 \
        --steps 3 --warmup 1 --repeats 2 --ignore-eos                          # fixed length: like with like
    .venv/bin/python benchmarks/bench_sampler.py --base smollm2 --prompts 2 --group-size 4 --max-new-tokens 32 \
        --steps 3 --warmup 1 --repeats 1 --greedy-prompts 0                    # stops at EOS: lengths differ
    BENCH_THREADS=1 .venv/bin/python benchmarks/bench_sampler.py --prompts 2 --group-size 2 --max-new-tokens 6 \
        --steps 2 --warmup 1 --repeats 1                                       # smoke (random base)

What is timed: `PolicyRLModule.sample` -- the call `training_step` makes for its rollouts (reference_in_sampling
off, the default), dispatching on `--model.sampler` -- on the module's own batches: P prompts of the two-policies
family's RL distribution "A" (TriggerDataModule, `collate_prompts`: `encode_prompt`, left-padded; with a pretrained
base its chat template and generation prompt) repeated G times each (`repeat_interleave`, as `training_step`), up to
`--max-new-tokens` at `--temperature` (1: top-k 0, top-p 1). No reward, no loss, no backward. The module is built
by its own `setup` (no Trainer, no optimizer step: the weights are the base's). `--base`: the random-init Qwen2-style
model of bench_grpo.py (hidden 256, 4 layers, over the family's word-level tokenizer; shared through --work-dir) or
`smollm2` (SmolLM2-135M-Instruct, `resolve_pretrained`, fp32) or a directory holding a causal LM and its tokenizer.

Each variant (sampler) runs in its own worker process (peak RSS per variant), `--warmup` untimed calls then
`--steps` timed calls on the next batches (the same prompts for every variant: batches in dataset order); variants
interleaved over `--repeats` rounds (round r: torch seed r). Per variant: generated tokens/s (the real sampled
tokens, each row up to and including its EOS, never padding), completions/s, mean completion tokens, median seconds
per sampling call, decode positions/s (rows x longest completion: what the batched loop computes), peak RSS.

A call's time includes the prefill (static: each distinct prompt once, its K/V repeated G times; kv_loop and
hf_generate: all P*G rows) and, for static, reading and fusing the weights (its peak RSS is higher by about that copy).
The samplers' draws are not one shared sequence (different logits to float rounding, different RNG use), so
completion lengths differ between samplers: compare tokens/s along with the mean completion tokens. `--ignore-eos`: every
completion is exactly `--max-new-tokens` long -- the module's sample call with an EOS id no token has (-1; the
samplers take the EOS id as an argument, no library code changes), checked in each worker -- so tokens/s is like
with like. Greedy check (once, its own worker, `--greedy-prompts` distinct prompts, G = 1, EOS on): temperature 0
through the same call; the three samplers must give identical tokens (`greedy_equal`; per sampler the rows that
differ from hf_generate's). Prints one JSON line (machine, load, threads = BENCH_THREADS); a markdown table to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

SAMPLERS = ("static", "kv_loop", "hf_generate")
NO_EOS = -1  # an EOS id no token has: the samplers then run exactly max_new_tokens


class _NoEosTokenizer:
    """The module's tokenizer, but with EOS id -1 (`--ignore-eos`): `PolicyLMBase.sample` hands the samplers
    `tokenizer.eos_token_id`, so they never stop early and mask nothing."""

    eos_token_id = NO_EOS

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def grpo_args(args, n_batches: int) -> types.SimpleNamespace:
    """What bench_grpo's helpers read: its `trigger_dm` makes P * (steps + 2) prompts."""
    return types.SimpleNamespace(prompts=args.prompts, steps=n_batches, work_dir=args.work_dir, base=args.base)


def build(args, sampler: str, n_batches: int, prompts: int):
    """(module, prompt batches): PolicyRLModule set up on the base with `sampler`, and `n_batches` batches of
    `prompts` prompts from the trigger datamodule (dataset order, `collate_prompts`: the module's batches)."""
    import torch

    from benchmarks import bench_grpo as G
    from lightning_modules.policy.rl import PolicyRLModule

    gargs = grpo_args(args, n_batches)
    gargs.prompts = prompts
    path, tokenizer = G.base_dirs(gargs)
    dm = G.trigger_dm(gargs, 0, tokenizer)
    dm.setup("fit")
    items = dm.train_items
    if len(items) < n_batches * prompts:
        raise RuntimeError(f"the datamodule made {len(items)} prompts, {n_batches * prompts} needed")
    batches = [dm.collate_prompts(items[i * prompts:(i + 1) * prompts]) for i in range(n_batches)]
    torch.manual_seed(0)
    module = PolicyRLModule(backbone=path, tokenizer=tokenizer, min_sft_fidelity=0, group_size=max(args.group_size, 2),
                            max_new_tokens=args.max_new_tokens, temperature=1.0, sampler=sampler)
    module._datamodule = lambda: dm  # setup without a Trainer: the module's own build, no optimizer step
    module.setup("fit")
    module.train()  # as under trainer.fit: each sampler puts the model in eval mode for its call and back
    return module, batches, path


def worker_sampler(args) -> dict:
    import torch

    t0 = time.perf_counter()
    module, batches, _ = build(args, args.variant, args.warmup + args.steps, args.prompts)
    load_seconds = time.perf_counter() - t0
    if args.ignore_eos:
        module.tokenizer = _NoEosTokenizer(module.tokenizer)
    torch.manual_seed(args.seed)
    G = args.group_size
    times, tokens, positions, completions, lengths, prompt_tokens = [], 0, 0, 0, [], []
    for i, batch in enumerate(batches):
        ids = batch["input_ids"].repeat_interleave(G, dim=0)  # (P*G, Tp): as training_step
        mask = batch["attention_mask"].repeat_interleave(G, dim=0)
        start = time.perf_counter()
        comp, comp_mask = module.sample(ids, mask, args.temperature)  # (B, L)
        seconds = time.perf_counter() - start
        if args.ignore_eos and (comp.shape[1] != args.max_new_tokens or not bool(comp_mask.all())):
            raise AssertionError(f"--ignore-eos: {args.variant} stopped early ({tuple(comp.shape)}, "
                                 f"{int(comp_mask.sum())} real tokens)")
        if i < args.warmup:
            continue
        times.append(seconds)
        tokens += int(comp_mask.sum())  # real sampled tokens, EOS included, no padding
        positions += comp.shape[0] * comp.shape[1]
        completions += comp.shape[0]
        lengths += comp_mask.sum(1).tolist()
        prompt_tokens += batch["attention_mask"].sum(1).tolist()
    total = sum(times)
    return {"variant": args.variant, "seed": args.seed, "calls_timed": len(times),
            "tokens_per_s": round(tokens / total, 2), "completions_per_s": round(completions / total, 3),
            "mean_completion_tokens": round(tokens / completions, 2),
            "eos_share": round(sum(n < args.max_new_tokens for n in lengths) / len(lengths), 3),
            "median_call_s": round(statistics.median(times), 4), "call_s": [round(t, 4) for t in times],
            "decode_positions_per_s": round(positions / total, 2), "generated_tokens": tokens,
            "mean_prompt_tokens": round(statistics.mean(prompt_tokens), 1),
            "load_seconds": round(load_seconds, 2), "peak_rss_mb": round(C.peak_rss_mb(), 1)}


def worker_greedy(args) -> dict:
    """Temperature 0 through the module's sample call, each sampler on the same prompts (G = 1, EOS on)."""
    import torch

    out, lengths, ids = {}, {}, None
    for sampler in SAMPLERS:
        module, (batch,), _ = build(args, sampler, 1, args.greedy_prompts)
        comp, comp_mask = module.sample(batch["input_ids"], batch["attention_mask"], 0.0)
        out[sampler], lengths[sampler] = comp, comp_mask.sum(1).tolist()
        ids = batch["input_ids"]
    width = max(c.shape[1] for c in out.values())  # after its EOS a row holds pad: compare at one width
    pad = module.tokenizer.pad_token_id
    full = {s: torch.nn.functional.pad(c, (0, width - c.shape[1]), value=pad) for s, c in out.items()}
    differing = {s: [i for i in range(len(ids)) if not torch.equal(full[s][i], full["hf_generate"][i])]
                 for s in SAMPLERS if s != "hf_generate"}
    equal = not any(differing.values())
    return {"greedy_equal": bool(equal), "prompts": int(ids.shape[0]), "max_new_tokens": args.max_new_tokens,
            "completion_tokens": lengths,
            "rows_differing_from_hf_generate": differing}


def base_config(args) -> dict:
    from benchmarks import bench_grpo as G

    gargs = grpo_args(args, 1)
    path, tokenizer = G.base_dirs(gargs)
    out = {"base": args.base, **({"model": C.MODEL_OVERRIDES} if tokenizer is None else {"base_path": path})}
    return {**out, "base_model": C.model_summary(path, causal_lm=True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    p.add_argument("--prompts", type=int, default=4, help="P prompts per sampling call")
    p.add_argument("--group-size", type=int, default=8, help="G completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=5, help="timed sampling calls per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed sampling calls first")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--ignore-eos", action="store_true", help="every completion exactly --max-new-tokens long")
    p.add_argument("--greedy-prompts", type=int, default=4, help="prompts of the greedy equality check (0: skip)")
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench"))
    p.add_argument("--worker", choices=("sampler", "greedy"), help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    C.add_base_argument(p)
    args = p.parse_args()
    if args.temperature <= 0:
        raise SystemExit("--temperature must be > 0 (rollouts are sampled; the greedy check runs on its own)")
    C.offline_env()
    os.makedirs(args.work_dir, exist_ok=True)
    if args.worker:
        print(json.dumps((worker_greedy if args.worker == "greedy" else worker_sampler)(args)))
        return
    from benchmarks import bench_grpo as G

    path, tokenizer = G.base_dirs(grpo_args(args, 1))  # build / convert once here, not inside a timed worker
    timeout = C.worker_timeout(tokenizer)
    common = ["--prompts", str(args.prompts), "--group-size", str(args.group_size), "--max-new-tokens",
              str(args.max_new_tokens), "--temperature", str(args.temperature), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--greedy-prompts", str(args.greedy_prompts), "--work-dir", args.work_dir,
              "--base", args.base] + (["--ignore-eos"] if args.ignore_eos else [])
    t0 = time.perf_counter()
    greedy = None
    if args.greedy_prompts > 0:
        greedy = C.run_worker(__file__, common + ["--worker", "greedy"], timeout=timeout)
        C.eprint("greedy:", json.dumps(greedy))
    runs = C.interleave(args.variants, args.repeats,
                        lambda v, r: C.run_worker(__file__, common + ["--worker", "sampler", "--variant", v,
                                                                      "--seed", str(r)], timeout=timeout), C.eprint)
    keys = ("tokens_per_s", "completions_per_s", "mean_completion_tokens", "median_call_s", "decode_positions_per_s",
            "peak_rss_mb")
    table = {v: {k: C.summary([r[k] for r in rs], 4) for k in keys} for v, rs in runs.items()}
    for v, rs in runs.items():
        table[v]["per_round_tokens_per_s"] = [r["tokens_per_s"] for r in rs]
        table[v]["eos_share"] = [r["eos_share"] for r in rs]
    ratios = {}
    if "hf_generate" in table:
        ref = table["hf_generate"]
        for v in table:
            if v != "hf_generate":
                ratios[f"{v}/hf_generate"] = {
                    k: round(table[v][k]["median"] / ref[k]["median"], 3) for k in ("tokens_per_s", "completions_per_s")}
    first = next(iter(runs.values()))[0]
    out = {"bench": "sampler", "machine": C.machine_info(),
           "config": {**base_config(args), "family": G.FAMILY, "distribution": G.RL_DIST, "prompts": args.prompts,
                      "group_size": args.group_size, "completions_per_call": args.prompts * args.group_size,
                      "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                      "ignore_eos": args.ignore_eos, "steps": args.steps, "warmup": args.warmup,
                      "repeats": args.repeats, "threads": C.THREADS, "dtype": "fp32",
                      "mean_prompt_tokens": first["mean_prompt_tokens"]},
           "greedy_equal": None if greedy is None else greedy["greedy_equal"], "greedy": greedy,
           "results": table, "ratios_vs_hf_generate": ratios, "wall_s": round(time.perf_counter() - t0, 1)}
    C.eprint(C.markdown_table(
        ["sampler", "tokens/s", "completions/s", "mean completion tokens", "median call s", "peak RSS MB"],
        [[v, *(f"{t[k]['median']} [{t[k]['min']}, {t[k]['max']}]" for k in keys[:4]), t["peak_rss_mb"]["median"]]
         for v, t in table.items()]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
