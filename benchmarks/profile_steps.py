"""Where the time goes: torch.profiler of our reward-model training step, cProfile of our GRPO step.

    .venv/bin/python benchmarks/profile_steps.py rm     # RewardModelModule step (length-bucketed), op table
    .venv/bin/python benchmarks/profile_steps.py grpo   # PolicyRLModule steps under the Trainer, function table
    .venv/bin/python benchmarks/profile_steps.py decode # the static decoder's step, eager vs torch.compile
    .venv/bin/python benchmarks/profile_steps.py levers # GRPO step phases A/B: fused vs HF log-probs, reference

Prints one JSON line (top entries and the shares the docs quote); the full tables go to stderr.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402


def profile_rm(args) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    paths = C.write_workload(args.work_dir, 480, 512)
    dm = C.preference_datamodule(paths, 16, 64)
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(0)
    model = C.reward_module(paths["tokenizer"], length_buckets=args.buckets)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    batches = iter(dm.train_dataloader())

    def step(batch):
        C.bt_step(model, opt, batch)

    step(next(batches))  # warm-up
    todo = [next(batches) for _ in range(args.steps)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for b in todo:
            step(b)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    C.eprint(events.table(sort_by="self_cpu_time_total", row_limit=20))
    mm = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
    attn = sum(e.self_cpu_time_total for e in events if "attention" in e.key)
    return {"profile": "rm_step", "buckets": args.buckets, "steps": args.steps, "wall_s": round(wall, 3),
            "share_matmul": round(mm / total, 3), "share_attention": round(attn / total, 3),
            "top_ops": [{"op": e.key, "share": round(e.self_cpu_time_total / total, 3)} for e in top]}


SAMPLER_FUNCTION = {"hf_generate": "sample_completions", "kv_loop": "sample_with_kv_cache", "static": "sample_static"}


def profile_grpo(args) -> dict:
    import lightning.pytorch as pl

    from benchmarks import bench_grpo as G
    from callbacks.reference_model import ReferenceModelCallback
    from lightning_modules.policy.rl import PolicyRLModule

    ns = argparse.Namespace(work_dir=args.work_dir, prompts=4, steps=args.steps, group_size=8)
    path = G.model_dir(ns)
    dm = G.trigger_dm(ns, 0)
    model = PolicyRLModule(backbone=path, min_sft_fidelity=0, group_size=8, lr=1e-5, max_new_tokens=24,
                           reference_coef=args.beta, **G.OURS[args.variant])
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, default_root_dir=tempfile.mkdtemp(prefix="prof_grpo_"),
                         callbacks=[ReferenceModelCallback()])  # β > 0: the frozen copy, as cli.py adds it
    prof = cProfile.Profile()
    prof.enable()
    trainer.fit(model, datamodule=dm)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).sort_stats("cumulative")
    stats.print_stats(25)
    C.eprint(buf.getvalue())
    by_name = {}
    for (file, _, name), (_, _, _, cum, _) in stats.stats.items():
        by_name[name] = max(by_name.get(name, 0.0), cum)
    step = by_name.get("training_step", float("nan"))
    gen = by_name.get(SAMPLER_FUNCTION[model.sampler], float("nan"))
    fwd = by_name.get("completion_logprobs" if model.hparams.shared_prompt_forward else "sequence_logits", float("nan"))
    back = by_name.get("manual_backward", float("nan"))
    score = by_name.get("score", float("nan"))
    total = by_name.get("fit", float("nan"))
    return {"profile": "grpo_step", "variant": args.variant, "beta": args.beta, "steps": args.steps,
            "fit_s": round(total, 3), "training_step_s": round(step, 3), "sampling_s": round(gen, 3),
            "share_sampling": round(gen / step, 3), "share_logprob_forwards": round(fwd / step, 3),
            "share_backward": round(back / step, 3), "share_score": round(score / step, 3)}


def profile_decode(args) -> dict:
    """One decode step of the GRPO workload (32 rows, 14-token prompts, 24 new tokens): eager vs
    `torch.compile(dynamic=True)`, per step in wall and CPU time, and the compiled logits' largest difference."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks import bench_grpo as G
    from lightning_modules.fast.static_decoder import _decoder

    torch.set_num_threads(args.threads)
    ns = argparse.Namespace(work_dir=args.work_dir, prompts=4, steps=2, group_size=8)
    model = AutoModelForCausalLM.from_pretrained(G.model_dir(ns)).eval()
    B, Tp, L = 32, 14, 24
    S = Tp + L
    dec = _decoder([model], S)
    cfg = model.config
    shape = (B, cfg.num_key_value_heads, S, cfg.hidden_size // cfg.num_attention_heads)
    keys = [torch.randn(shape) for _ in dec.layers]
    values = [torch.randn(shape) for _ in dec.layers]
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
    tok, pos = torch.randint(3, cfg.vocab_size, (B,)), torch.full((B,), Tp)

    @torch.no_grad()
    def per_step(step, reps: int = 3) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(reps):
            w, c = time.perf_counter(), time.process_time()
            for j in range(L - 1):
                step(tok, pos + j, Tp + j, keys, values, mask[..., :Tp + j + 1])
            walls.append((time.perf_counter() - w) / (L - 1))
            cpus.append((time.process_time() - c) / (L - 1))
        return sorted(walls)[reps // 2], sorted(cpus)[reps // 2]

    eager = per_step(dec.step)
    compiled = torch.compile(dec.step, dynamic=True)
    t0 = time.perf_counter()
    per_step(compiled, reps=1)
    compile_s = time.perf_counter() - t0
    fast = per_step(compiled)
    with torch.no_grad():
        diff = (dec.step(tok, pos, Tp, keys, values, mask[..., :Tp + 1])
                - compiled(tok, pos, Tp, keys, values, mask[..., :Tp + 1])).abs().max().item()
    return {"profile": "decode_step", "threads": args.threads, "eager_ms": round(1e3 * eager[0], 3),
            "eager_cpu_ms": round(1e3 * eager[1], 3), "compiled_ms": round(1e3 * fast[0], 3),
            "compiled_cpu_ms": round(1e3 * fast[1], 3), "first_compiled_pass_s": round(compile_s, 1),
            "speedup_wall": round(eager[0] / fast[0], 3), "max_abs_logit_diff": diff}


def profile_levers(args) -> dict:
    """The GRPO step's phases, alternated in one process (A, B, A, B, ...) so other jobs' load hits all alike:
    policy log-probs forward + backward through completion_logprobs' fused path vs the HF path; sampling alone;
    sampling with the reference scored in the decode steps; the reference's own (fused) forward. Per phase the
    median over `--steps` rounds of wall and CPU time (CPU time is the steadier figure on a loaded machine)."""
    import torch
    from transformers import AutoModelForCausalLM

    import lightning_modules.policy.completion_logprobs as CL
    from benchmarks import bench_grpo as G
    from lightning_modules.fast.static_decoder import sample_and_score, sample_static

    torch.set_num_threads(args.threads)
    ns = argparse.Namespace(work_dir=args.work_dir, prompts=4, steps=2, group_size=8)
    path = G.model_dir(ns)
    dm = G.trigger_dm(ns, 0)
    dm.setup("fit")
    model = AutoModelForCausalLM.from_pretrained(path).train()
    ref = AutoModelForCausalLM.from_pretrained(path).requires_grad_(False).eval()
    batch = next(iter(dm.train_dataloader()))
    ids, am, tok = batch["input_ids"], batch["attention_mask"], dm.tokenizer
    rows, rows_mask = ids.repeat_interleave(8, 0), am.repeat_interleave(8, 0)
    torch.manual_seed(0)
    comp, cm = sample_static(model, rows, rows_mask, 24, 1.0, tok.eos_token_id, tok.pad_token_id)
    fused_ok = CL._fused_ok

    def fwd_bwd(fused: bool) -> None:
        CL._fused_ok = fused_ok if fused else (lambda m: False)
        try:
            (CL.completion_logprobs(model, ids, am, comp, cm, 8) * cm).sum().backward()
        finally:
            CL._fused_ok = fused_ok
        model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def ref_forward() -> None:
        CL.completion_logprobs(ref, ids, am, comp, cm, 8)

    phases = {"logprobs_fwd_bwd_hf": lambda: fwd_bwd(False), "logprobs_fwd_bwd_fused": lambda: fwd_bwd(True),
              "sample": lambda: sample_static(model, rows, rows_mask, 24, 1.0, tok.eos_token_id, tok.pad_token_id),
              "sample_with_reference": lambda: sample_and_score(model, [ref], rows, rows_mask, 24, 1.0,
                                                                tok.eos_token_id, tok.pad_token_id),
              "reference_forward": ref_forward}
    wall = {k: [] for k in phases}
    cpu = {k: [] for k in phases}
    for f in phases.values():
        f()  # warm-up
    for _ in range(args.steps):
        for k, f in phases.items():
            w, c = time.perf_counter(), time.process_time()
            f()
            wall[k].append(time.perf_counter() - w)
            cpu[k].append(time.process_time() - c)
    med = lambda v: round(1e3 * sorted(v)[len(v) // 2], 1)  # noqa: E731
    return {"profile": "grpo_levers", "threads": args.threads, "rounds": args.steps,
            "wall_ms": {k: med(v) for k, v in wall.items()}, "cpu_ms": {k: med(v) for k, v in cpu.items()},
            "loadavg": C.machine_info()["loadavg"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["rm", "grpo", "decode", "levers"])
    p.add_argument("--threads", type=int, default=2, help="decode: torch threads")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--buckets", type=int, default=4)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--variant", default="ours", help="grpo: a variant of bench_grpo.py's ours_* (module options)")
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "shiftgen_bench"))
    args = p.parse_args()
    C.offline_env()
    print(json.dumps({"rm": profile_rm, "grpo": profile_grpo, "decode": profile_decode,
                      "levers": profile_levers}[args.what](args)))


if __name__ == "__main__":
    main()
