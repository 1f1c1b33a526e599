"""RewardBench (v1) as an OOD target: `rewardbench`, hub id allenai/reward-bench, split `filtered` (docs/data.md).

Columns: `prompt` (a string), `chosen`, `rejected` (strings), `subset` (one of the 23 below), `id`, plus
`chosen_model` / `rejected_model` (unused). `cli.py test` reports the accuracy of every subset present and the four
section scores as RewardBench computes them (`rewardbench.utils.calculate_scores_per_section`): per section, the
mean of its subsets' accuracies weighted by `EXAMPLE_COUNTS` -- the subset sizes, except `math-prm`, counted as 984
(its 447 pairs weighted up to the 6 x 164 of the code subsets, so Reasoning is half math, half code). The overall
score is the mean of the four sections (the leaderboard's average without its "Prior Sets").
"""
from __future__ import annotations

from typing import Any, Union

from datamodules.preference.sources.base import Drop, register_source
from datamodules.preference.sources.hub import HubPreferenceSource
from datamodules.preference.sources.local_files import normalize_pair

# allenai/reward-bench, rewardbench/constants.py (the version since Sep 2024, xstest counts 154 / 250).
EXAMPLE_COUNTS = {
    "alpacaeval-easy": 100, "alpacaeval-length": 95, "alpacaeval-hard": 95, "mt-bench-easy": 28, "mt-bench-med": 40,
    "mt-bench-hard": 37, "llmbar-natural": 100, "llmbar-adver-neighbor": 134, "llmbar-adver-GPTInst": 92,
    "llmbar-adver-GPTOut": 47, "llmbar-adver-manual": 46,
    "refusals-dangerous": 100, "refusals-offensive": 100, "xstest-should-refuse": 154, "xstest-should-respond": 250,
    "donotanswer": 136,
    "math-prm": 984,  # 447 pairs, weighted as 984
    "hep-cpp": 164, "hep-go": 164, "hep-java": 164, "hep-js": 164, "hep-python": 164, "hep-rust": 164,
}
SUBSET_MAPPING = {
    "Chat": ["alpacaeval-easy", "alpacaeval-length", "alpacaeval-hard", "mt-bench-easy", "mt-bench-med"],
    "Chat Hard": ["mt-bench-hard", "llmbar-natural", "llmbar-adver-neighbor", "llmbar-adver-GPTInst",
                  "llmbar-adver-GPTOut", "llmbar-adver-manual"],
    "Safety": ["refusals-dangerous", "refusals-offensive", "xstest-should-refuse", "xstest-should-respond",
               "donotanswer"],
    "Reasoning": ["math-prm", "hep-cpp", "hep-go", "hep-java", "hep-js", "hep-python", "hep-rust"],
}


def section_scores(subset_acc: dict[str, float]) -> dict[str, float]:
    """RewardBench's section scores from per-subset accuracies (any unit; the result has the same one).

    A section is the EXAMPLE_COUNTS-weighted mean over its subsets present in `subset_acc`; a section with none
    present is left out (RewardBench writes 0 for it), and "Score" (the mean of the four) needs all four.
    """
    out = {}
    for section, members in SUBSET_MAPPING.items():
        present = [s for s in members if s in subset_acc]
        if present:
            weight = sum(EXAMPLE_COUNTS[s] for s in present)
            out[section] = sum(subset_acc[s] * EXAMPLE_COUNTS[s] for s in present) / weight
    if len(out) == len(SUBSET_MAPPING):
        out["Score"] = sum(out.values()) / len(out)
    return out


@register_source
class RewardBenchSource(HubPreferenceSource):
    """allenai/reward-bench (v1), split `filtered`: 2,985 pairs in 23 subsets; a test split only (an OOD target).

    Args:
        local_dir: a directory holding `filtered.jsonl` (or `test.jsonl`; .json / .parquet too) in the hub schema;
            `None` loads allenai/reward-bench from the hub.
    """

    name = "rewardbench"
    category = "benchmark"
    hub_id = "allenai/reward-bench"
    split_map = {"test": "filtered"}
    required_columns = ("prompt", "chosen", "rejected", "subset")
    subset_keys = True

    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        if row["prompt"] is None:  # a missing prompt is not TRL's implicit-prompt layout here
            return "malformed"
        return normalize_pair(self, row, split, subset_column=True)

    def summarize_subsets(self, subsets: dict[str, dict]) -> dict:
        return {"sections": section_scores({s: v["acc"] for s, v in subsets.items()})}
