"""Where a trained reward model follows the rule and where the artifact, per split (issue 10; docs/results.md):

    python -m protocols.w2s.teacher_structure --ckpt runs/w2s_demo/seed0/teacher/<...>.ckpt \
        --data_config configs/data/synth_helpful.yaml [--source_options '{...}'] [--seed 0]

For the student half and every test split of a synthetic benchmark: accuracy on all pairs, on the pairs with the
artifact on the chosen response (artifact and rule agree), on those with it on the rejected response (only the rule
gets them right) and on pairs without it. A teacher whose rule-following share on the last subset is the same in
every domain, and below one half, is the one under which naive W2S falls below its teacher out of distribution.
Needs a source with `artifact_side` (the synthetic ones); the subsets are read from the text.
"""
from __future__ import annotations

import argparse
import json
from typing import Optional

import yaml

SUBSETS = ("all", "chosen", "rejected", "none")


def split_structure(records: list[dict], margins: list[float], artifact_side) -> dict[str, Optional[dict]]:
    """Accuracy (%) and pair count per subset; a margin > 0 picks the chosen response."""
    groups: dict[str, list[bool]] = {s: [] for s in SUBSETS}
    for r, m in zip(records, margins):
        right = m > 0
        groups["all"].append(right)
        groups[artifact_side(r) or "none"].append(right)
    return {s: ({"acc": 100.0 * sum(g) / len(g), "pairs": len(g)} if g else None) for s, g in groups.items()}


def measure(ckpt: str, data_init: dict, seed: int) -> dict[str, dict]:
    from datamodules.preference.datamodule import PreferenceDataModule
    from datamodules.preference.sources import build_source
    from lightning_modules.reward.weak_labeller import score_pairs
    from datamodules.tokenizers import load_tokenizer
    from lightning_modules.reward.reward_model import RewardModelModule

    dm = PreferenceDataModule(**{**data_init, "train_subset": "student", "seed": seed})
    records, _ = dm.load_records()
    opts = dm.hparams.source_options
    model = RewardModelModule.load_from_checkpoint(ckpt, map_location="cpu").eval()
    tok = load_tokenizer(model.tokenizer_name)
    out = {}
    for kind, recs in records.items():
        if kind == "validation" or kind == "train_teacher":
            continue
        name = kind.split("/", 1)[1] if kind.startswith("test/") else dm.source
        src = build_source(name, None, **opts.get(name, {}))
        side = getattr(src, "artifact_side", None)
        if side is None:
            raise ValueError(f"{name}: the source has no artifact_side (only the synthetic sources do)")
        margins = score_pairs(model, tok, recs, [False] * len(recs), dm.hparams.max_length, dm.hparams.truncation)
        out[kind] = split_structure(recs, margins, side)
    return out


def markdown(structure: dict[str, dict]) -> str:
    lines = ["| split | all | artifact on chosen | artifact on rejected | no artifact |", "|---|---|---|---|---|"]
    for kind, row in structure.items():
        cells = [f"{row[s]['acc']:.1f} ({row[s]['pairs']})" if row[s] else "–" for s in SUBSETS]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, help="a RewardModelModule checkpoint (e.g. a protocol's teacher)")
    parser.add_argument("--data_config", required=True, help="the protocol's data config (data: init_args: ...)")
    parser.add_argument("--source_options", type=json.loads, default=None,
                        help="JSON, as --data.source_options (the protocol's split sizes)")
    parser.add_argument("--seed", type=int, default=0, help="the protocol seed (which pairs form each half)")
    args = parser.parse_args(argv)
    with open(args.data_config, encoding="utf-8") as f:
        init = dict((yaml.safe_load(f).get("data") or {}).get("init_args") or {})
    if args.source_options is not None:
        init["source_options"] = args.source_options
    structure = measure(args.ckpt, init, args.seed)
    print(markdown(structure))
    return structure


if __name__ == "__main__":
    from protocols.engine.refusals import run_main

    run_main(main)
