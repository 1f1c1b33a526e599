"""Your own preference files as a source or an OOD target: `local:<path>`, in TRL's preference formats (docs/data.md).

    --data.ood_targets '["local:/data/my_prefs.jsonl"]'      one file: its `test` split (an OOD target, `cli.py test`)
    --data.source local:/data/my_prefs                       a folder: train / validation / test files

A row is one of TRL's preference layouts (decided per row, so a file may mix them):

    standard        {"prompt": "...", "chosen": "...", "rejected": "..."}
    conversational  {"prompt": [{"role", "content"}, ...], "chosen": [{"role": "assistant", ...}], "rejected": [...]}
    implicit prompt {"chosen": ..., "rejected": ...} without `prompt`: message lists that share all but their last
                    (assistant) message, or strings that share a prefix (cut at its last whitespace).

Optional columns: `score_chosen` / `score_rejected` (equal scores: `tie`), `id` (the record key instead of the
content hash), `subset` (per-subset accuracy in `cli.py test`). The drop rules are the hub adapters'.

A `null` is read as a missing key: a row without `chosen` or `rejected`, or with either `null`, is refused, naming
the file and its line as an editor counts them ("line 4 of train.jsonl"); an optional column that is `null` is
absent (`"prompt": null` is the implicit-prompt layout).
"""
from __future__ import annotations

import os
from typing import Any, Optional, Union

from datamodules.preference.records import CANONICAL_SPLITS, content_key
from datamodules.preference.sources.base import (
    SOURCE_PREFIXES, DataError, Drop, find_split_file, iter_table, subset_key,
)
from datamodules.preference.sources.hub import HubPreferenceSource, Messages, _text, as_messages, score_pair_fault

PREFIX = "local:"
EXTENSIONS = (".jsonl", ".json", ".parquet")


def prompt_messages(value: Any) -> Optional[Messages]:
    """A prompt given as a string (one user turn) or as a message list; None when it is neither."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return as_messages(value)


def response_text(value: Any) -> Optional[str]:
    """A response given as a string or as a list holding one assistant message; None when it is neither."""
    if isinstance(value, str):
        return value
    messages = as_messages(value)
    if messages is None or len(messages) != 1 or messages[0]["role"] != "assistant":
        return None
    return messages[0]["content"]


def split_shared_prefix(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) of two texts that share their beginning.

    The prompt ends at the last whitespace inside the common prefix, so no word is cut in two (TRL's
    `extract_prompt` cuts at the first differing character).
    """
    n = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        n += 1
    cut = max(chosen.rfind(" ", 0, n + 1), chosen.rfind("\n", 0, n + 1), chosen.rfind("\t", 0, n + 1))
    cut = max(cut, 0)
    return chosen[:cut], chosen[cut:], rejected[cut:]


def normalize_pair(source: HubPreferenceSource, row: dict, split: str, subset_column: bool) -> Union[dict, Drop]:
    """The shared mapping of the TRL layouts to a record (also RewardBench's, whose prompt is a string)."""
    subset = row.get("subset") if subset_column else None
    if subset_column and (not isinstance(subset, str) or not subset.strip()):
        return "malformed"
    chosen, rejected = row["chosen"], row["rejected"]
    prompt_value = row.get("prompt")
    if prompt_value is not None:  # explicit prompt
        prompt = prompt_messages(prompt_value)
        chosen, rejected = response_text(chosen), response_text(rejected)
        if prompt is None or chosen is None or rejected is None:
            return "malformed"
    elif isinstance(chosen, str) and isinstance(rejected, str):  # implicit prompt, standard
        text, chosen, rejected = split_shared_prefix(chosen, rejected)
        prompt = [{"role": "user", "content": text.strip()}]
    else:  # implicit prompt, conversational
        chosen, rejected = as_messages(chosen), as_messages(rejected)
        if not chosen or not rejected or chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
            return "malformed"
        if chosen[:-1] != rejected[:-1]:
            return "prompt_mismatch"
        prompt, chosen, rejected = chosen[:-1], chosen[-1]["content"], rejected[-1]["content"]
    scores = row.get("score_chosen"), row.get("score_rejected")
    fault = score_pair_fault(*scores, ("score_chosen", "score_rejected"))
    if fault:
        return fault
    if scores[0] is not None and scores[0] == scores[1]:
        return "tie"
    chosen, rejected = _text(chosen), _text(rejected)
    row_id = row.get("id")
    row_key = content_key(prompt, chosen, rejected) if row_id is None else row_id
    return source.finish(split, prompt, chosen, rejected, key=subset_key(subset, row_key))


class LocalPreferenceSource(HubPreferenceSource):
    """Preference pairs from your own files, named `local:<path>` (the name is the path: each file is its source).

    Args:
        name: "local:<path>": a file (.jsonl, .json or .parquet) serves as the `test` split; a directory holds one
            file per canonical split (`train`, `validation`, `test`, each .jsonl / .json / .parquet).
        local_dir: must stay None (the path is in the name).
    """

    category = "custom"
    required_columns = ("chosen", "rejected")
    null_is_missing = True  # `"rejected": null` is refused as a missing `rejected` is, naming the line (docs/data.md)
    subset_keys = True

    def __init__(self, name: str, local_dir: Optional[str] = None):
        if local_dir is not None:
            raise DataError(f"{name}: a local: source takes its path from its name, not from --data.local_dirs "
                            f"(got {local_dir!r})")
        super().__init__(local_dir=None)
        self.name = name
        self.path = name[len(PREFIX):]
        if os.path.isdir(self.path):
            found = [s for s in CANONICAL_SPLITS if any(
                os.path.isfile(os.path.join(self.path, s + e)) for e in EXTENSIONS)]
            self.split_map = {s: s for s in found}
        elif os.path.isfile(self.path):
            if not self.path.endswith(EXTENSIONS):
                raise DataError(f"{name}: {self.path!r} is not a .jsonl, .json or .parquet file")
            self.split_map = {"test": "test"}
        else:
            raise DataError(f"{name}: {self.path!r} is neither a file nor a directory")

    def load(self, split: str):
        if split not in self.split_map and os.path.isfile(self.path):
            raise DataError(
                f"{self.name} is one file, which serves as the test split only (an OOD target, or what `cli.py test` "
                f"scores); as --data.source it needs a {split!r} split: give a directory holding train.jsonl and "
                "test.jsonl (validation.jsonl optional; .json / .parquet too) as local:<directory>")
        return super().load(split)

    def _read_rows(self, split: str):
        path = self.path if os.path.isfile(self.path) else find_split_file(self.path, [split], self.name)
        return iter_table(path), path

    def resolve_columns(self, columns: list[str], origin: str) -> None:
        if "chosen" not in columns and "completion" in columns and "label" in columns:
            raise DataError(f"{self.name}: {origin} is in TRL's unpaired preference format (prompt, completion, "
                            "label): pairwise accuracy needs a chosen and a rejected response per row")
        super().resolve_columns(columns, origin)
        self.has_subsets = "subset" in columns

    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        return normalize_pair(self, row, split, self.has_subsets)


SOURCE_PREFIXES[PREFIX] = LocalPreferenceSource
