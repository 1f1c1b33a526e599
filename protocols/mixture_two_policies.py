"""One command: the two-policy conditional-mixture reproduction, offline on CPU (SFT -> GRPO on A -> final table).

    python -m protocols.mixture_two_policies              # SFT, GRPO on A (full sequence and persona tokens only)
    python -m protocols.mixture_two_policies --symmetric  # also GRPO on B from the same SFT checkpoint

About 6-7 minutes on 2 free cores (measured: SFT ~1.5 min, each 100-step RL run ~2 min).
Each stage is `python cli.py fit --config configs/mixture/<stage>.yaml` in a subprocess (extra `--set` overrides are
passed through, e.g. `--set=--trainer.max_steps=50`). The final tables (JSON + Markdown) are written by the
PersonaTrackingCallback in each RL run's log directory and collected into `runs/mixture/two_policies_results.md`.
`--workdir DIR` runs every stage with DIR as the working directory, so the configs' relative `runs/...` paths (logs,
checkpoints, the RL stages' `init_checkpoint`) all land under DIR: a test or a second run never touches the
repository's `runs/`.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_stage(config: str, extra: list[str], workdir: str = ROOT) -> float:
    cmd = [sys.executable, os.path.join(ROOT, "cli.py"), "fit", "--config", os.path.join(ROOT, config), *extra]
    print("$", " ".join(cmd), f"(in {workdir})", flush=True)
    start = time.time()
    subprocess.run(cmd, cwd=workdir, env=dict(os.environ, **OFFLINE), check=True)
    return time.time() - start


def newest_table(run_name: str, stage: str, workdir: str = ROOT) -> dict:
    paths = glob.glob(os.path.join(workdir, "runs", "mixture", run_name, "version_*", f"{stage}_table.json"))
    if not paths:
        raise FileNotFoundError(f"no {stage}_table.json under {workdir}/runs/mixture/{run_name}")
    with open(max(paths, key=os.path.getmtime)) as f:
        return json.load(f)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--symmetric", action="store_true", help="also run GRPO on B (the symmetric experiment)")
    p.add_argument("--skip-sft", action="store_true", help="reuse runs/mixture/checkpoints/two_policies/sft.ckpt")
    p.add_argument("--set", action="append", default=[], help="extra CLI arguments for every RL stage")
    p.add_argument("--workdir", default=ROOT, help="working directory of every stage: its runs/ receives all outputs")
    args = p.parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    from callbacks.persona_tracking import PersonaTrackingCallback

    times = {}
    ckpt = os.path.join(workdir, "runs", "mixture", "checkpoints", "two_policies", "sft.ckpt")
    if not (args.skip_sft and os.path.isfile(ckpt)):
        times["sft"] = run_stage("configs/mixture/two_policies_sft.yaml", [], workdir)
    lines = ["# Two policies: SFT then GRPO (seed 0)", ""]
    if "sft" in times:
        lines.append(f"SFT wall time: {times['sft']:.0f} s")
    stages = [  # (run name, config stage, extra args, title)
        ("two_policies_rl_A", "rl_A", [], "GRPO on A, full-sequence policy gradient"),
        ("two_policies_rl_A_persona", "rl_A", ["--model.persona_tokens_only=true",
                                               "--trainer.logger.init_args.name=mixture/two_policies_rl_A_persona"],
         "GRPO on A, policy gradient on the persona tokens only (RL on the mixture weights)"),
    ]
    if args.symmetric:
        stages.append(("two_policies_rl_B", "rl_B", [], "GRPO on B, full-sequence policy gradient"))
    for run_name, stage, extra, title in stages:
        times[run_name] = run_stage(f"configs/mixture/two_policies_{stage}.yaml", extra + args.set, workdir)
        table = newest_table(run_name, f"two_policies_{stage}", workdir)
        lines += ["", f"## {title} (wall time {times[run_name]:.0f} s)", "", PersonaTrackingCallback.markdown(table)]
    text = "\n".join(lines)
    out = os.path.join(workdir, "runs", "mixture", "two_policies_results.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(text)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
