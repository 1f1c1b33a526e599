"""Per-subset accuracy of a test split whose source has subsets (RewardBench; a local file with a `subset` column).

The pairs' outcomes come from `PairwiseAccuracy.pair_outcomes` (gathered from every process, each pair once); a
pair's subset is read from its record id by its source (`PreferenceSource.subset_of`), and the source adds its
own summary (RewardBench: the section scores, `rewardbench.section_scores`). Accuracies are fractions, as
`test/acc/<split>`.
"""
from __future__ import annotations

import re
from collections import defaultdict

import torch

from datamodules.preference.sources import build_source


def subset_report(datamodule, split: str, index: torch.Tensor, correct: torch.Tensor) -> dict:
    """{"subsets": {subset: {"acc", "pairs"}}, **the source's summary}, or {} when the split has no subsets."""
    dataset = (getattr(datamodule, "datasets", None) or {}).get(f"test/{split}")
    hparams = getattr(datamodule, "hparams", {})
    if dataset is None or "local_dirs" not in hparams:
        return {}
    source = build_source(split, hparams["local_dirs"].get(split), **hparams["source_options"].get(split, {}))
    if not source.subset_keys:
        return {}
    record_id = dict(zip(dataset.cols["index"], dataset.cols["id"]))
    outcomes: dict[str, list[float]] = defaultdict(list)
    for i, c in zip(index.tolist(), correct.tolist()):
        subset = source.subset_of(record_id[i])
        if subset is not None:
            outcomes[subset].append(c)
    if not outcomes:
        return {}
    subsets = {s: {"acc": sum(v) / len(v), "pairs": len(v)} for s, v in sorted(outcomes.items())}
    return {"subsets": subsets, **source.summarize_subsets(subsets)}


def slug(name: str) -> str:
    """'Chat Hard' -> 'chat_hard' (log keys)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def subset_log_dict(split: str, report: dict) -> dict[str, float]:
    logs = {f"test/subset_acc/{split}/{s}": v["acc"] for s, v in report["subsets"].items()}
    logs.update({f"test/section/{split}/{slug(k)}": v for k, v in report.get("sections", {}).items()})
    return logs


def format_subset_tables(results: dict) -> str:
    """Markdown tables (percent) of every split with subsets; '' when none has any."""
    out = []
    for split, r in results.items():
        if not isinstance(r, dict) or "subsets" not in r:
            continue
        out += ["", f"| {split} subset | pairs | accuracy |", "|---|---|---|"]
        out += [f"| {s} | {v['pairs']} | {100 * v['acc']:.2f} |" for s, v in r["subsets"].items()]
        if r.get("sections"):
            out += ["", f"| {split} section | score |", "|---|---|"]
            out += [f"| {k} | {100 * v:.2f} |" for k, v in r["sections"].items()]
    return "\n".join(out)
