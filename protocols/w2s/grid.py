"""A grid of W2S protocols in one command (docs/cluster.md): every protocol config listed, each with its own out_dir,
run by `protocols.w2s` with the grid's launcher settings; `--status` sums up every stage of every protocol;
`--estimate` prints the planned stages and their GPU-hours from a FLOP count (no model is loaded).

    python -m protocols.w2s.grid --config configs/experiment/paper/grid.yaml                 # submit everything
    python -m protocols.w2s.grid --config configs/experiment/paper/grid.yaml --status
    python -m protocols.w2s.grid --config configs/experiment/paper/grid.yaml --estimate
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from jsonargparse import ActionConfigFile, ArgumentParser

from protocols.engine.slurm_options import SlurmOptions

# Approximate public train / test(+validation used as test) pair counts of the hub datasets (after ties dropped),
# for the estimate only; the runs read the real sizes.
TRAIN_PAIRS = {"helpsteer3": 38_000, "hh_helpful": 43_800, "hh_harmless": 42_500, "ultrafeedback": 61_100,
               "pku_saferlhf": 73_900, "rail": 8_000}
TEST_PAIRS = {"helpsteer3": 2_000, "hh_helpful": 2_350, "hh_harmless": 2_300, "ultrafeedback": 2_000,
              "pku_saferlhf": 8_200, "rail": 1_000}
PARAMS = {"llama3.2-1b": 1.24e9, "llama3.1-8b-lora": 8.0e9, "qwen2.5-0.5b": 0.49e9, "qwen2.5-7b-lora": 7.6e9}


@dataclass
class Grid:
    """A list of protocol configs run with one launcher.

    Args:
        protocols: `protocols.w2s` config files, one protocol (out_dir) each.
        launcher: "slurm" (each stage a job) or "local" (one protocol after another, here).
        slurm: the stage jobs' resources (`protocols.engine.slurm_options.SlurmOptions`).
        args: more `protocols.w2s` flags for every protocol (e.g. ["--seeds=[0]"]).
        tokens_per_sequence: mean tokens per prompt + response, for `--estimate` only.
        gpu_tflops: sustained bf16 TFLOP/s per GPU, for `--estimate` only (H100 dense peak 989 × an assumed 0.4).
    """

    protocols: list[str]
    launcher: str = "slurm"
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    args: list[str] = field(default_factory=list)
    tokens_per_sequence: int = 512
    gpu_tflops: float = 400.0


def protocol_args(grid: Grid, config: str) -> list[str]:
    """`protocols.w2s` flags of one protocol of the grid: its config, the launcher and every `--slurm.*` value."""
    flags = ["--config", config, "--launcher", grid.launcher, *grid.args]
    for name, value in vars(grid.slurm).items():
        flags.append(f"--slurm.{name}={json.dumps(value) if isinstance(value, list) else value}")
    return flags


def estimate(grid: Grid) -> list[dict]:
    """Per stage: pairs, FLOPs and GPU-hours. Training FLOPs per token: 6N for full fine-tuning, 4N with LoRA (the
    frozen base gets activation gradients but no weight gradients), + 2N for ANCHOR's reference forward; testing 2N
    per token over the ID and OOD test splits; the teacher also labels the student half (2N per token)."""
    from protocols.w2s.protocol import parse, plan_stages

    rows = []
    for config in grid.protocols:
        p = parse(["--config", config, *grid.args])
        source = _source(p)
        targets = _targets(p)
        half = TRAIN_PAIRS[source] / 2
        test = sum(TEST_PAIRS[s] for s in [source, *targets])
        seq = 2 * grid.tokens_per_sequence  # a pair: chosen + rejected
        for stage in plan_stages(p):
            model = _model_name(p.teacher_configs if stage.name == "teacher" else p.student_configs)
            n = PARAMS.get(model, float("nan"))
            per_token = 4 * n if model.endswith("lora") else 6 * n
            method = next((m for m in p.methods if m.name == stage.method), None)
            anchor = (stage.value if method and method.sweep_flag == "--model.anchor_coef"
                      else method.anchor_coef if method else 0.0)
            fit = 0.0 if stage.evaluates else half * seq * (per_token + (2 * n if anchor > 0 else 0))
            flops = fit + test * seq * 2 * n  # a stage that evaluates another's checkpoint fits nothing
            if stage.name == "teacher":
                fits = len(stage.search.values) if stage.search else 1  # the search: at most one fit per value
                flops = fits * fit + test * seq * 2 * n + half * seq * 2 * n  # + labelling the student half
            rows.append({"protocol": p.out_dir, "stage": f"seed{stage.seed}/{stage.name}", "model": model,
                         "train_pairs": int(half), "test_pairs": test, "flops": flops,
                         "gpu_hours": flops / (grid.gpu_tflops * 1e12) / 3600})
    return rows


def _model_name(configs: list[str]) -> str:
    return re.sub(r"\.ya?ml$", "", configs[-1].rsplit("/", 1)[-1]) if configs else "?"


def _data_init(p) -> dict:
    import yaml

    return (yaml.safe_load(open(p.data_configs[-1]))["data"]["init_args"])


def _source(p) -> str:
    return _data_init(p)["source"]


def _targets(p) -> list[str]:
    return list(_data_init(p).get("ood_targets") or [])


def main(argv: Optional[list[str]] = None) -> None:
    parser = ArgumentParser(description=__doc__, default_config_files=[])
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(Grid, as_group=False)
    parser.add_argument("--status", action="store_true", help="every stage of every protocol, summed up")
    parser.add_argument("--estimate", action="store_true", help="planned stages and GPU-hours, nothing submitted")
    cfg = parser.parse_args(argv)
    d = cfg.as_dict()
    d.pop("config", None)
    status, est = d.pop("status"), d.pop("estimate")
    grid = Grid(**{**d, "slurm": SlurmOptions(**d["slurm"])})
    if est:
        rows = estimate(grid)
        total = sum(r["gpu_hours"] for r in rows)
        print(f"{len(grid.protocols)} protocols, {len(rows)} stages, {total:.1f} GPU-hours in all "
              f"(at {grid.gpu_tflops:.0f} TFLOP/s per GPU, {grid.tokens_per_sequence} tokens per sequence)")
        by_kind: dict[str, list[float]] = {}
        for r in rows:
            by_kind.setdefault(f"{r['model']} {r['stage'].split('/', 1)[1]}", []).append(r["gpu_hours"])
        for kind, hours in sorted(by_kind.items()):
            print(f"  {kind}: {len(hours)} stages, {min(hours):.2f}–{max(hours):.2f} GPU-h each")
        return
    from protocols.w2s import protocol as w2s

    counts: dict[str, int] = {}
    for config in grid.protocols:
        flags = protocol_args(grid, config)
        print(f"\n## {config} (out_dir {w2s.parse(['--config', config, *grid.args]).out_dir})")  # whose table follows
        rows = w2s.main(["--config", config, "--status", *grid.args] if status else flags)
        if isinstance(rows, list):
            for r in rows:
                state = r["state"].split(" (")[0]
                counts[state] = counts.get(state, 0) + 1
    if counts:
        print("grid: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))


if __name__ == "__main__":
    from protocols.engine.refusals import run_main

    run_main(main)
