"""The targets of docs/benchmarks.md, read from one `run_all.sh` invocation's JSON files: value, bar, PASS / FAIL.

    python benchmarks/targets.py runs/benchmarks          # a Markdown table on stdout (run_all.sh ends with it)

A benchmark that did not run (or whose JSON is missing) shows as "not run"; nothing is carried over from an
earlier invocation, so every figure of the table comes from the same run of the same code.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Callable, Optional


def load(out_dir: str, name: str) -> Optional[dict]:
    path = os.path.join(out_dir, f"{name}.json")
    if not os.path.isfile(path):
        return None
    lines = [l for l in open(path, encoding="utf-8").read().splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None  # TRL's evaluate prints a dict line before ours


def rounds(values) -> str:
    return "rounds " + ", ".join(f"{v:g}" for v in values) if values else ""


def fit_ratio(pair: str) -> Callable[[dict], tuple[float, str]]:
    """A whole 2-epoch fit's ratio (`bench_anchor.py --epochs 2`), with each epoch's step ratio and the rounds."""
    def value(j: dict) -> tuple[float, str]:
        r = j["ratios"][pair]
        return r["fit_train_s"], (f"epoch 1 step {r['epoch1_step_s_mean']}×, epoch 2 step {r['epoch2_step_s_mean']}×; "
                                  f"fit CPU {r['fit_train_cpu_s']}×; fit " + rounds(r["per_round"]["fit_train_s"]))
    return value


# (target, benchmark JSON, bar as text, value(json) -> (figure, detail), passes(figure) -> bool)
TARGETS: list[tuple[str, str, str, Callable[[dict], tuple[float, str]], Callable[[float], bool]]] = [
    ("RM training ≥ 2× TRL pairs/s", "rm_train", "≥ 2",
     lambda j: (j["ratios_vs_trl"]["ours"]["pairs_per_s"], rounds(j["ratios_vs_trl"]["ours"]["per_round"])),
     lambda v: v >= 2.0),
    ("RM eval ≥ 3× TRL pairs/s", "rm_eval", "≥ 3",
     lambda j: (j["ratios_vs_trl"]["ours"]["pairs_per_s"], rounds(j["ratios_vs_trl"]["ours"]["per_round"])),
     lambda v: v >= 3.0),
    ("RM training MFU (model FLOPs)", "rm_train", "≥ 0.55",
     lambda j: (j["results"]["ours"]["useful_mfu"]["median"],
                f"[{j['results']['ours']['useful_mfu']['min']}, {j['results']['ours']['useful_mfu']['max']}]"),
     lambda v: v >= 0.55),
    ("ANCHOR / naive, frozen prefix (W2S student), 2-epoch fit", "anchor_w2s", "≤ 1.1",
     fit_ratio("w2s_anchor/w2s_naive"), lambda v: v <= 1.1),
    ("ANCHOR / naive, full copy + cache_outputs, 2-epoch fit", "anchor_copy_2epochs", "≤ 1.3",
     fit_ratio("anchor_copy_cached/naive"), lambda v: v <= 1.3),
    ("ANCHOR peak RSS, LoRA adapters off / naive LoRA", "anchor", "≤ 1.1",
     lambda j: (j["ratios"]["anchor_lora/naive_lora"]["fit_peak_rss_mb"],
                f"fit increment {j['ratios']['anchor_lora/naive_lora']['fit_increment_mb']}×"),
     lambda v: v <= 1.1),
    *[(f"GRPO ≥ 2× TRL completions/s, β = {b}", "grpo", "≥ 2",
       (lambda b: lambda j: (j["ratios_vs_trl"][f"ours/trl@beta={b}"]["completions_per_s"],
                             rounds(j["ratios_vs_trl"][f"ours/trl@beta={b}"]["per_round"])
                             + f"; median step {j['ratios_vs_trl'][f'ours/trl@beta={b}']['median_step']}×; "
                             f"round spread ours {100 * j['results'][f'ours@beta={b}']['spread']:.1f}%, "
                             f"TRL {100 * j['results'][f'trl@beta={b}']['spread']:.1f}%"))(b),
       lambda v: v >= 2.0) for b in ("0", "0.04")],
    ("data prep: per-pair wall 300k / 100k (linear)", "data_prep", "≤ 1.1",
     lambda j: (j["targets"]["linear_scaling"]["per_pair_ratio"],
                f"CPU per pair {j['targets']['linear_scaling']['cpu_per_pair_ratio']}×"),
     lambda v: v <= 1.1),
    ("data prep: reload / first preparation (worst size)", "data_prep", "≤ 0.05",
     lambda j: (j["targets"]["reload_le_5pct"]["worst"],
                ", ".join(f"{r['pairs'] // 1000}k {r['reload_fraction']:.3f}" for r in j["rows"])),
     lambda v: v <= 0.05),
    ("data prep: peak RSS at 300k pairs, MB", "data_prep", "< 2048",
     lambda j: (j["targets"]["peak_rss_lt_2gb"]["worst_mb"],
                ", ".join(f"cache {r['cache_mb']} MB at {r['pairs'] // 1000}k" for r in j["rows"])),
     lambda v: v < 2048),
    ("`make demo` wall s, fresh cache (table = docs)", "demo", "≤ 240",
     lambda j: (j["target"]["wall_s_median"],
                f"CPU {j['results']['after']['cpu_s']['median']} s, table = docs: {j['tables_equal_docs']}"
                + (f"; before ({j['before_commit']}) {j['results']['before']['wall_s']['median']} s, after / before "
                   f"{j['ratio_after_before']['wall_s']}×" if "before_commit" in j else "")),
     lambda v: v <= 240.0),
]


def table(out_dir: str) -> tuple[str, bool]:
    lines = ["| target | bar | measured | status | detail |", "|---|---|---|---|---|"]
    all_pass = True
    for name, bench, bar, value, passes in TARGETS:
        data = load(out_dir, bench)
        if data is None:
            lines.append(f"| {name} | {bar} | – | not run | `{bench}.json` missing |")
            all_pass = False
            continue
        try:
            figure, detail = value(data)
        except (KeyError, TypeError, ZeroDivisionError) as e:
            lines.append(f"| {name} | {bar} | – | not run | `{bench}.json` lacks {e} |")
            all_pass = False
            continue
        ok = passes(figure)
        if name.startswith("`make demo`"):
            ok = ok and data["tables_equal_docs"]
        all_pass &= ok
        lines.append(f"| {name} | {bar} | {figure:g} | {'PASS' if ok else 'FAIL'} | {detail} |")
    return "\n".join(lines), all_pass


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "runs/benchmarks"
    text, _ = table(out_dir)
    machine = (load(out_dir, "matmul_peak") or {}).get("machine", {})
    print(f"Targets from {out_dir} ({machine.get('utc', '?')}, {machine.get('cpu', '?')}):\n")
    print(text)


if __name__ == "__main__":
    main()
