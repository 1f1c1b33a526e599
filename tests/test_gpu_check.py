"""benchmarks/gpu_check.sh: the dry run resolves and parses every step (no CUDA, nothing executed); a real run
without CUDA stops before any work with a message that says so; steps are judged on their measured values."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.sh")
STEPS = ["build_models", "rm_fit_bf16", "rm_test_bf16", "anchor_lora_bf16", "bnb_4bit", "bnb_8bit",
         "mixture_sft_qwen2", "grpo_bf16_qwen2", "mixture_sft_gemma3", "grpo_bf16_gemma3", "ddp_nccl_1gpu",
         "throughput_rm_vs_trl_gpu", "bench_rm_train_cpu", "bench_grpo_cpu"]


def _run(*args, out):
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)


def test_dry_run_resolves_and_parses_every_step(tmp_path):
    proc = _run("--dry-run", out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.load(open(tmp_path / "gpu_check.json"))
    assert report["dry_run"] is True and report["failed"] == 0
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == STEPS
    assert all(s["status"] == "PARSED" for s in steps.values())
    assert report["budget_sum_s"] <= 600  # the whole check in under 10 minutes
    work = report["work_dir"]
    assert work == str(tmp_path / "gpu_check_work")
    assert not os.path.exists(os.path.join(work, "models"))  # nothing was built
    for s in steps.values():  # every command printed as it will run
        assert s["command"] in proc.stdout
    cli_steps = [s for s in steps.values() if s["kind"] == "cli"]
    assert len(cli_steps) == 10
    for s in cli_steps:
        assert s["argv"][0] == os.path.join(ROOT, "cli.py")
        assert s["parsed"]["precision"] == "bf16-mixed"
        assert s["parsed"]["devices"] in (1, "1")
    fit = steps["rm_fit_bf16"]["parsed"]
    assert fit["subcommand"] == "fit" and fit["backbone"] == os.path.join(work, "models", "qwen2")
    test = steps["rm_test_bf16"]
    assert test["parsed"]["subcommand"] == "test"
    assert f"--ckpt_path={work}/runs/rm_fit_bf16/version_0/checkpoints/last.ckpt" in test["argv"]
    assert steps["ddp_nccl_1gpu"]["parsed"]["strategy"] == "ddp"
    assert steps["ddp_nccl_1gpu"]["checks"]["backend"] == "nccl"
    assert steps["anchor_lora_bf16"]["parsed"]["backbone"].endswith("models/llama")
    assert "--model.anchor_coef=1e-4" in steps["anchor_lora_bf16"]["argv"]
    assert steps["anchor_lora_bf16"]["checks"]["reference_params"] == 0  # adapters off: no second copy
    for bits, layer in (("4bit", "Linear4bit"), ("8bit", "Linear8bitLt")):
        assert f"--model.quantization={bits}" in steps[f"bnb_{bits}"]["argv"]
        assert steps[f"bnb_{bits}"]["checks"][f"quantized_layers:{layer}"] == ">0"
    for fam, layer in (("qwen2", "qwen2.5-1.5b"), ("gemma3", "gemma3-1b")):
        sft, rl = steps[f"mixture_sft_{fam}"], steps[f"grpo_bf16_{fam}"]
        assert sft["parsed"]["model"].endswith("PolicySFTModule") and rl["parsed"]["model"].endswith("PolicyRLModule")
        assert any(a.endswith(f"base_models/{layer}_rl_A.yaml") for a in rl["argv"])
    assert steps["bench_rm_train_cpu"]["parsed"]["args"]["repeats"] == 1
    assert steps["bench_grpo_cpu"]["parsed"]["args"]["steps"] == 4
    assert steps["throughput_rm_vs_trl_gpu"]["parsed"]["args"]["steps"] == 30


def test_real_run_without_cuda_fails_early(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _run("--only", "rm_fit_bf16", out=tmp_path)
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr and "--dry-run" in proc.stderr
    assert not os.path.exists(tmp_path / "gpu_check_work")  # stopped before building anything


def test_unknown_step_is_named(tmp_path):
    proc = _run("--dry-run", "--only", "rm_fitt", out=tmp_path)
    assert proc.returncode == 2 and "unknown steps ['rm_fitt']" in proc.stderr


def test_judge_on_hand_values():
    from benchmarks.gpu_check import FP32_MASTER, Step, judge

    step = Step("s", "", [], 1, {"global_step": 4, "metric:val/acc": "finite", "quantized_layers:Linear4bit": ">0",
                                 **FP32_MASTER})
    good = {"ok": True, "global_step": 4, "metrics": {"val/acc": 0.5}, "quantized_layers": {"Linear4bit": 7},
            "trainable_dtypes": ["torch.float32"]}
    assert judge(step, good) == (True, "")
    assert judge(step, {**good, "metrics": {"val/acc": float("nan")}})[1].startswith("metric:val/acc")
    assert judge(step, {**good, "quantized_layers": {"Linear4bit": 0}})[1].startswith("quantized_layers:Linear4bit")
    assert judge(step, {**good, "trainable_dtypes": ["torch.bfloat16"]})[1].startswith("trainable_dtypes")
    assert judge(step, {"ok": False, "error": "RuntimeError: boom"}) == (False, "RuntimeError: boom")
