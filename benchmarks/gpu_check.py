"""The GPU check of issue 24: every GPU code path once, on local stand-ins of real architectures, in under 10 minutes.

    benchmarks/gpu_check.sh             # on a CUDA machine: run every step, one PASS/FAIL line each
    benchmarks/gpu_check.sh --dry-run   # anywhere: resolve, parse and print every step; nothing is executed
    benchmarks/gpu_check.sh --only rm_fit_bf16 rm_test_bf16

No hub: the first step builds random-initialised Qwen2, Llama, Gemma 3 (gemma3_text) and GPT-2 checkpoints at the
widths of their 1B-class releases (2 layers; bf16 safetensors, as the hub ships them) beside a locally built
word-level tokenizer, and the synthetic preference pairs of benchmarks/common.py; every later step loads them by
directory, through the code users run (`python cli.py fit|test ...`). Each cli step runs in its own process through
`--measure`, which calls `cli.main` with the printed arguments and records wall time, steady-state items/s, peak GPU
memory, the trainer's metrics and what the step must show (quantized layers, the LoRA reference without a copy, the
NCCL process group). The JSON goes to `$OUT/gpu_check.json` (or `--out DIR`).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

FAMILIES = ("qwen2", "llama", "gemma3_text", "gpt2")
TOTAL_BUDGET_S = 570  # the whole check, build included, stays under 10 minutes
# Full fine-tuning under bf16-mixed: AdamW must update fp32 weights (an update below bf16's resolution is lost).
# The stand-ins are saved in bf16 as the hub's checkpoints are: the teacher configs load them as float32
# (--model.dtype), the policy modules always do.
FP32_MASTER = {"trainable_dtypes": ["torch.float32"]}


@dataclass
class Step:
    """One line of the check.

    Args:
        name: the step's name (what --only takes).
        what: one line saying what it exercises.
        argv: the command after the python executable (cli steps: cli.py and its arguments).
        budget_s: the step's timeout.
        checks: what its measured result must show, {key: expected} (see `judge`).
        kind: "cli" (run through --measure, parsed with cli.py's parser) or "script".
    """

    name: str
    what: str
    argv: list[str]
    budget_s: int
    checks: dict = field(default_factory=dict)
    kind: str = "cli"

    @property
    def command(self) -> str:
        return "python " + " ".join(shlex.quote(a) for a in self.argv)


def cfg(path: str) -> str:
    return os.path.join(ROOT, "configs", path)


def plan(work: str) -> list[Step]:
    """Every step, resolved: absolute paths under `work` (models, data, runs)."""
    models, data = os.path.join(work, "models"), os.path.join(work, "bench", "data-512-256-0")
    cli = os.path.join(ROOT, "cli.py")
    me = os.path.join(ROOT, "benchmarks", "gpu_check.py")

    def rm(family: str, model_cfg: str, run: str, steps: int, *extra: str) -> list[str]:
        m = os.path.join(models, family)
        return [cli, "fit", "--config", cfg("trainer/gpu_ddp.yaml"), "--config", cfg(model_cfg),
                "--config", cfg("data/ultrafeedback.yaml"), f"--model.backbone={m}", f"--model.tokenizer={m}",
                f'--data.local_dirs={{"ultrafeedback": "{data}"}}', "--data.ood_targets=[]",
                "--data.train_subset=all", "--data.train_labels=gold", "--data.max_length=256",
                f"--data.cache_dir={os.path.join(work, 'cache')}", "--trainer.devices=1", "--trainer.strategy=auto",
                f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=4", f"--trainer.val_check_interval={steps}",
                "--trainer.logger=" + json.dumps({"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {
                    "save_dir": os.path.join(work, "runs"), "name": run, "version": 0}}), *extra]

    def mixture(layer: str, family: str, stage: str, steps: int, *extra: str) -> list[str]:
        base = "two_policies_sft.yaml" if stage == "sft" else "two_policies_rl_A.yaml"
        m = os.path.join(models, family)
        swap = [f"--model.backbone={m}"] if stage == "sft" else ["--model.min_sft_fidelity=0"]
        return [cli, "fit", "--config", cfg(f"mixture/{base}"), "--config",
                cfg(f"mixture/base_models/{layer}_{stage}.yaml"), *swap, f"--model.tokenizer={m}",
                f"--data.cache_dir={os.path.join(work, 'cache')}", f"--trainer.max_steps={steps}",
                "--trainer.val_check_interval=10", "--data.num_val_per_distribution=16", *extra]

    rm_ckpt = os.path.join(work, "runs", "rm_fit_bf16", "version_0", "checkpoints", "last.ckpt")
    rm_fit = rm("qwen2", "model/qwen2.5-0.5b.yaml", "rm_fit_bf16", 40)
    rm_test = [a for a in rm_fit if not a.startswith(("--trainer.max_steps", "--trainer.limit_val", "--trainer.val_"))]
    rm_test[1] = "test"
    rm_test += [f"--ckpt_path={rm_ckpt}"]
    lora = "--model.lora={r: 16, alpha: 32, dropout: 0.0, target_modules: all-linear}"
    bench = os.path.join(work, "bench_cpu")
    return [
        Step("build_models", "random-init Qwen2/Llama/Gemma3/GPT-2 at 1B-class widths (2 layers, bf16) + tokenizer "
             "+ preference pairs, saved as local HF directories", [me, "--build", work], 60, kind="script"),
        Step("rm_fit_bf16", "reward model fit, Qwen2 stand-in, bf16-mixed, as configs/model/qwen2.5-0.5b.yaml",
             rm_fit, 45, {"global_step": 40, "precision": "bf16-mixed", "metric:val/acc": "finite", **FP32_MASTER}),
        Step("rm_test_bf16", "reward model test from the fit's last.ckpt (ID split)", rm_test, 30,
             {"precision": "bf16-mixed", "metric:test/acc/ultrafeedback": "finite"}),
        Step("anchor_lora_bf16", "ANCHOR (lambda 1e-4) with a LoRA student, reference = adapters off, Llama stand-in, "
             "gradient checkpointing", rm("llama", "model/llama3.2-1b.yaml", "anchor_lora_bf16", 20, lora,
                                          "--model.anchor_coef=1e-4"), 40,
             {"global_step": 20, "reference_mode": "disable_adapter", "reference_params": 0,
              "metric:train/anchor_loss": "finite"}),
        Step("bnb_4bit", "QLoRA: 4-bit nf4 loading + LoRA training steps, Qwen2 stand-in",
             rm("qwen2", "model/qwen2.5-0.5b.yaml", "bnb_4bit", 10, lora, "--model.quantization=4bit"), 35,
             {"global_step": 10, "quantized_layers:Linear4bit": ">0"}),
        Step("bnb_8bit", "8-bit loading + LoRA training steps, Qwen2 stand-in",
             rm("qwen2", "model/qwen2.5-0.5b.yaml", "bnb_8bit", 10, lora, "--model.quantization=8bit"), 35,
             {"global_step": 10, "quantized_layers:Linear8bitLt": ">0"}),
        Step("mixture_sft_qwen2", "Part B SFT in bf16, configs/mixture/base_models/qwen2.5-1.5b_sft.yaml on the "
             "Qwen2 stand-in", mixture("qwen2.5-1.5b", "qwen2", "sft", 20, "--data.num_train=320"), 35,
             {"global_step": 20, "precision": "bf16-mixed", **FP32_MASTER}),
        Step("grpo_bf16_qwen2", "GRPO steps in bf16 from that SFT (static KV-cache sampler)",
             mixture("qwen2.5-1.5b", "qwen2", "rl_A", 10, "--trainer.num_sanity_val_steps=0"), 40,
             {"rl_step": 10, "precision": "bf16-mixed", **FP32_MASTER}),
        Step("mixture_sft_gemma3", "Part B SFT in bf16, gemma3-1b_sft.yaml on the Gemma 3 stand-in",
             mixture("gemma3-1b", "gemma3_text", "sft", 20, "--data.num_train=320"), 35,
             {"global_step": 20, "precision": "bf16-mixed"}),
        Step("grpo_bf16_gemma3", "GRPO steps in bf16 from that SFT (kv_loop sampler: Gemma 3 has no static path)",
             mixture("gemma3-1b", "gemma3_text", "rl_A", 10, "--trainer.num_sanity_val_steps=0"), 40,
             {"rl_step": 10}),
        Step("ddp_nccl_1gpu", "Lightning DDP on 1 GPU (NCCL process group), GPT-2 stand-in reward model",
             [a if a != "--trainer.strategy=auto" else "--trainer.strategy=ddp" for a in
              rm("gpt2", "model/qwen2.5-0.5b.yaml", "ddp_nccl_1gpu", 20)], 40,
             {"global_step": 20, "strategy": "DDPStrategy", "backend": "nccl"}),
        Step("throughput_rm_vs_trl_gpu", "reward-model training pairs/s, ours vs TRL RewardTrainer on the GPU, same "
             "pairs, same Qwen2 stand-in, bf16", [os.path.join(ROOT, "benchmarks", "gpu_throughput.py"),
                                                  "--models", models, "--data", data, "--steps", "30"], 60,
             kind="script"),
        Step("bench_rm_train_cpu", "benchmarks/bench_rm_train.py as it is (it hard-codes accelerator=cpu): the "
             "CPU figure of the same comparison", [os.path.join(ROOT, "benchmarks", "bench_rm_train.py"),
                                                   "--repeats", "1", "--train-pairs", "96", "--test-pairs", "32",
                                                   "--warmup", "1", "--peak-gflops", "1", "--work-dir", bench], 40,
             kind="script"),
        Step("bench_grpo_cpu", "benchmarks/bench_grpo.py as it is (accelerator=cpu hard-coded): GRPO ours vs TRL",
             [os.path.join(ROOT, "benchmarks", "bench_grpo.py"), "--repeats", "1", "--steps", "4", "--warmup", "1",
              "--betas", "0.0", "--work-dir", bench], 45, kind="script"),
    ]


# ------------------------------------------------------------------------------------------------ dry run
class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def parse_step(step: Step) -> dict:
    """Parse a step's arguments with its own parser, executing nothing: cli.py's (LightningCLI) for cli steps,
    the script's argparse parser for scripts. Returns what was resolved; raises ValueError when a parser refuses."""
    args = step.argv[1:]
    if step.kind == "cli":
        from protocols.engine.stage_identity import resolve_cli_config

        sub, rest = args[0], [a for a in args[1:] if not a.startswith("--ckpt_path")]
        resolved = resolve_cli_config(rest)  # the subcommand's own flag (--ckpt_path) is not in that parser
        model, data, trainer = (resolved[k] for k in ("model", "data", "trainer"))
        return {"subcommand": sub, "model": model["class_path"], "backbone": model["init_args"].get("backbone"),
                "data": data["class_path"], "precision": trainer["precision"], "strategy": trainer["strategy"],
                "devices": trainer["devices"], "max_steps": trainer["max_steps"]}
    if step.argv[0].endswith("gpu_check.py"):
        return {"script": "gpu_check.py", "args": args}
    import argparse as _argparse
    import runpy

    real = _argparse.ArgumentParser.parse_args

    def stop(self, a=None, namespace=None):
        raise _Parsed(real(self, a, namespace))

    saved = sys.argv
    sys.argv = [step.argv[0], *args]
    _argparse.ArgumentParser.parse_args = stop
    try:
        runpy.run_path(step.argv[0], run_name="__main__")
    except _Parsed as parsed:
        return {"script": os.path.basename(step.argv[0]), "args": vars(parsed.namespace)}
    except SystemExit as err:
        raise ValueError(f"{step.argv[0]} refused {args}: exit {err.code}") from None
    finally:
        _argparse.ArgumentParser.parse_args = real
        sys.argv = saved
    raise ValueError(f"{step.argv[0]} never parsed its arguments")


# ------------------------------------------------------------------------------------------------ building
def build(work: str) -> dict:
    """The stand-in checkpoints and the preference pairs (CPU work; runs first on the GPU machine)."""
    from benchmarks import common as C
    from benchmarks.tiny_families import build_model_dir
    from datamodules.triggers.datamodule import TriggerDataModule

    C.write_workload(os.path.join(work, "bench"), 512, 256)
    words = sorted(set(C.content_words(C.VOCAB_SIZE - 4 - len(C.FORMAT_WORDS))) | set(C.FORMAT_WORDS)
                   | set(TriggerDataModule(family="two_policies", restate_trigger=True).vocabulary_words()))
    out = {}
    for family in FAMILIES:
        d = build_model_dir(family, os.path.join(work, "models", family), words, layers=2, scale="realistic",
                            dtype="bfloat16")
        out[family] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return {"model_bytes": out, "vocab": len(words) + 4}


# ------------------------------------------------------------------------------------------------ measuring
def measure(result_path: str, cli_args: list[str]) -> None:
    """Run `cli.main(cli_args)` once, as `python cli.py ...` would, and write what the step is judged on."""
    import torch
    import lightning.pytorch as pl

    import cli

    cuda = torch.cuda.is_available()
    marks: list[float] = []
    seen: dict = {}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class Timer(pl.Callback):
        def _mark(self, trainer, batch):
            sync()
            marks.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._mark(trainer, batch)

        def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            self._mark(trainer, batch)

        def on_train_end(self, trainer, pl_module):
            ref = [getattr(c, "reference", None) for c in trainer.callbacks]
            ref = [r for r in ref if r is not None]
            if ref:
                seen["reference_mode"] = ref[0].mode
                seen["reference_params"] = int(ref[0].parameter_count())
            strategy = trainer.strategy
            seen["backend"] = getattr(strategy, "_process_group_backend", None)
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                seen["backend"] = torch.distributed.get_backend()

    original = cli.ShiftCLI.instantiate_trainer

    def with_timer(self, **kwargs):
        trainer = original(self, **kwargs)
        trainer.callbacks.append(Timer())
        return trainer

    cli.ShiftCLI.instantiate_trainer = with_timer
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result: dict = {"ok": False}
    try:
        c = cli.main(args=cli_args)
        result["ok"] = True
    except BaseException as err:  # noqa: BLE001 - the step's failure is its result
        result["error"] = f"{type(err).__name__}: {str(err)[:2000]}"
        c = None
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    if cuda:
        result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if c is not None:
        trainer, module = c.trainer, c.model
        dm = c.datamodule
        steady = [b - a for a, b in zip(marks[2:], marks[3:])]  # the first steps (compile, allocator) excluded
        batch = getattr(dm, "hparams", {}).get("batch_size")
        if cli_args[0] == "test":
            batch = getattr(dm, "hparams", {}).get("eval_batch_size", batch)
        result.update(
            global_step=int(trainer.global_step), precision=str(trainer.precision),
            strategy=type(trainer.strategy).__name__,
            metrics={k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 0)() == 1},
            step_s_median=round(sorted(steady)[len(steady) // 2], 4) if steady else None,
            items_per_s=round(batch / sorted(steady)[len(steady) // 2], 2) if steady and batch else None,
            param_dtypes=sorted({str(p.dtype) for p in module.parameters()}),
            trainable_dtypes=sorted({str(p.dtype) for p in module.parameters() if p.requires_grad}),
            quantized_layers={n: sum(type(m).__name__ == n for m in module.modules())
                              for n in ("Linear4bit", "Linear8bitLt")},
            **seen,
        )
        if hasattr(module, "rl_step"):
            result["rl_step"] = int(module.rl_step)
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)


def judge(step: Step, result: dict) -> tuple[bool, str]:
    """PASS when the step ran and every check holds; the reason otherwise."""
    import math

    if not result.get("ok", False):
        return False, result.get("error", "no result")
    for key, want in step.checks.items():
        if key.startswith("metric:"):
            got = result.get("metrics", {}).get(key[len("metric:"):])
        elif key.startswith("quantized_layers:"):
            got = result.get("quantized_layers", {}).get(key.split(":", 1)[1])
        else:
            got = result.get(key)
        ok = (got is not None and math.isfinite(got)) if want == "finite" else \
            (got is not None and got > 0) if want == ">0" else got == want
        if not ok:
            return False, f"{key}: expected {want}, got {got!r}"
    return True, ""


def figure(result: dict) -> str:
    parts = [f"wall {result.get('wall_s', '?')} s"]
    if result.get("items_per_s") is not None:
        parts.append(f"{result['items_per_s']} items/s")
    for k, v in result.get("pairs_per_s", {}).items() if isinstance(result.get("pairs_per_s"), dict) else ():
        parts.append(f"{k} {v} pairs/s")
    if result.get("peak_gpu_mib") is not None:
        parts.append(f"peak GPU {result['peak_gpu_mib'] / 1024:.2f} GiB")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------ running
def run_step(step: Step, work: str, deadline: float) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", WANDB_DISABLED="true")
    result_path = os.path.join(work, "results", f"{step.name}.json")
    os.makedirs(os.path.dirname(result_path), exist_ok=True)
    if step.kind == "cli":
        argv = [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--measure", result_path, "--",
                *step.argv[1:]]
    else:
        argv = [sys.executable, *step.argv]
    timeout = max(1.0, min(step.budget_s, deadline - time.perf_counter()))
    t0 = time.perf_counter()
    log = os.path.join(work, "logs", f"{step.name}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    try:
        with open(log, "w") as f:
            proc = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=f, text=True,
                                  timeout=timeout)
        rc, stdout = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s", "wall_s": round(time.perf_counter() - t0, 1),
                "log": log}
    wall = round(time.perf_counter() - t0, 1)
    if step.kind == "cli":
        result = json.load(open(result_path)) if os.path.isfile(result_path) else {"ok": False,
                                                                                   "error": f"exit {rc}, no result"}
    else:  # scripts print one JSON line last
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        result = {"ok": rc == 0, "wall_s": wall}
        if lines:
            result.update(json.loads(lines[-1]), ok=rc == 0, wall_s=wall)
        if rc != 0:
            result["error"] = f"exit {rc} (log: {log})"
    result["process_wall_s"], result["log"] = wall, log
    return result


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="resolve, parse and print every step; execute nothing")
    p.add_argument("--only", nargs="+", help="run these steps (build_models runs first when models are missing)")
    p.add_argument("--out", default=os.environ.get("OUT"), help="where gpu_check.json goes (default $OUT)")
    p.add_argument("--work-dir", default=None, help="models, data and runs (default <out>/gpu_check_work or /tmp)")
    p.add_argument("--build", metavar="WORK", help=argparse.SUPPRESS)
    p.add_argument("--measure", metavar="RESULT", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.build:
        print(json.dumps(build(args.build)))
        return 0
    if args.measure:
        measure(args.measure, rest[1:] if rest[:1] == ["--"] else rest)
        return 0
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    work = args.work_dir or (os.path.join(args.out, "gpu_check_work") if args.out else "/tmp/shiftgen_gpu_check")
    steps = plan(os.path.abspath(work))
    names = [s.name for s in steps]
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            p.error(f"--only: unknown steps {unknown}; known: {names}")
        have = os.path.isfile(os.path.join(work, "models", "gpt2", "config.json"))
        steps = [s for s in steps if s.name in args.only or (s.name == "build_models" and not have)]
    report = {"check": "gpu_check", "dry_run": args.dry_run, "work_dir": os.path.abspath(work),
              "budget_s": TOTAL_BUDGET_S, "steps": []}
    if args.dry_run:
        failed = 0
        for s in steps:
            entry = {**asdict(s), "command": s.command}
            try:
                entry["parsed"], entry["status"] = parse_step(s), "PARSED"
            except (ValueError, SystemExit) as err:
                entry["parse_error"], entry["status"] = str(err)[:2000], "PARSE-FAIL"
                failed += 1
            report["steps"].append(entry)
            print(f"{entry['status']:10s} {s.name}  (budget {s.budget_s} s): {s.what}\n    {s.command}", flush=True)
        report["budget_sum_s"] = sum(s.budget_s for s in steps)
        return _finish(report, args.out, failed)

    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: CUDA is not available (torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
              "this check needs an NVIDIA GPU. `benchmarks/gpu_check.sh --dry-run` prints and parses the plan "
              "without one.", file=sys.stderr)
        return 2
    report["device"] = torch.cuda.get_device_name(0)
    deadline = time.perf_counter() + TOTAL_BUDGET_S
    failed = 0
    for s in steps:
        result = run_step(s, os.path.abspath(work), deadline)
        ok, why = judge(s, result) if s.kind == "cli" else (result.get("ok", False), result.get("error", ""))
        failed += not ok
        report["steps"].append({"name": s.name, "command": s.command, "status": "PASS" if ok else "FAIL",
                                "why": why, "result": result})
        print(f"{'PASS' if ok else 'FAIL'}  {s.name:26s} {figure(result)}" + (f"  -- {why[:300]}" if why else ""),
              flush=True)
    return _finish(report, args.out, failed)


def _finish(report: dict, out: Optional[str], failed: int) -> int:
    report["failed"] = failed
    if out:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "gpu_check.json")
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {path}")
    print(f"{len(report['steps']) - failed}/{len(report['steps'])} steps "
          f"{'parsed' if report['dry_run'] else 'passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
