"""The six real preference datasets (docs/data.md), each normalised to the record schema of `datamodules.preference.records`.

Every adapter applies the same drop rules, in this order, and reports them as short reasons:

    <label fault>    a label out of its documented type or range, one reason per field and fault
                     ("overall_preference out of range [-3, 3]", "score_chosen not a finite number", ...)
    malformed        the row does not have the documented structure (no assistant turn, ...)
    prompt_mismatch  chosen and rejected disagree on the conversation before the response
    tie              the source rates both responses equally (HelpSteer3, UltraFeedback, RAIL)
    empty_prompt     no prompt text at all
    empty            a response is empty or whitespace
    identical        both responses are the same text
    duplicate        the same (prompt, chosen, rejected) already appeared in this split

Responses are stripped of surrounding whitespace (HH transcripts put a space after "Assistant:").
"""
from __future__ import annotations

import math
import numbers
import re
from typing import Any, Optional, Union

from datamodules.preference.records import content_key, make_record
from datamodules.preference.sources.base import DataError, Drop, PreferenceSource, SourceSplit, register_source

Messages = list[dict]

_HH_ROLES = {"Human": "user", "Assistant": "assistant"}
_HH_ASSISTANT = "\n\nAssistant:"
_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")  # hh-rlhf separates turns by a blank line
_LINE_TURN = re.compile(r"(?:^|\n)[ \t]*(Human|Assistant):")  # RAIL context: one turn per line


class HubPreferenceSource(PreferenceSource):
    """Shared drop rules and id policy of the hub adapters; subclasses only map a row to its parts.

    Args:
        local_dir: a directory with one file per split in the hub schema (`train.jsonl`, `test_prefs.parquet`,
            ...); `None` loads `hub_id` from the hub.
    """

    def __init__(self, local_dir: Optional[str] = None):
        super().__init__(local_dir=local_dir)
        self._seen_keys: set = set()

    def load(self, split: str) -> SourceSplit:
        self._seen_keys = set()  # duplicates are detected within one split
        return super().load(split)

    def finish(
        self, split: str, prompt: Messages, chosen: Any, rejected: Any, key: Any = None
    ) -> Union[dict, Drop]:
        """Apply the common drop rules and build the record (`key=None`: a content hash is the id)."""
        chosen, rejected = _text(chosen), _text(rejected)
        if not any(m["content"].strip() for m in prompt):
            return "empty_prompt"
        if not chosen or not rejected:
            return "empty"
        if chosen == rejected:
            return "identical"
        key = content_key(prompt, chosen, rejected) if key is None else key
        if key in self._seen_keys:
            return "duplicate"
        self._seen_keys.add(key)
        return make_record(self.name, split, key, prompt, chosen, rejected)


# ---- parsing helpers -------------------------------------------------------------------------------------
def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def as_messages(value: Any) -> Optional[Messages]:
    """A list of {role, content} dicts in our form, or None when `value` is not one."""
    if not isinstance(value, list):
        return None
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return None
        out.append({"role": m["role"], "content": m["content"]})
    return out


def parse_turns(text: str, pattern: re.Pattern) -> Optional[Messages]:
    """Split a "Human: ... Assistant: ..." transcript into messages; None if text precedes the first turn."""
    parts = pattern.split(text)  # [before, role, content, role, content, ...]
    if parts[0].strip():
        return None
    messages = [{"role": _HH_ROLES[r], "content": c.strip()} for r, c in zip(parts[1::2], parts[2::2])]
    # A trailing empty "Assistant:" is the cue for the response, not a message.
    if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()
    return messages


def split_hh_transcript(transcript: str) -> Optional[tuple[Messages, str]]:
    """(prompt messages, response) of an hh-rlhf transcript: the response follows the last "Assistant:"."""
    cut = transcript.rfind(_HH_ASSISTANT)
    if cut < 0:
        return None
    response = transcript[cut + len(_HH_ASSISTANT):]
    if "\n\nHuman:" in response:  # the conversation ends on a human turn: no response to rate
        return None
    prompt = parse_turns(transcript[:cut], _HH_TURN)
    return None if prompt is None else (prompt, response)


def integer_label_fault(value: Any, field: str, low: int, high: int) -> Optional[Drop]:
    """None when `value` is an integer in [low, high], else the drop reason naming `field` and the fault.

    An integral float (2.0) counts as an integer: pandas writes an int column with gaps as floats. A bool does not
    (it is an int to Python), and NaN -- what a missing value becomes in pandas -- is its own fault.
    """
    if value is None:
        return f"{field} missing"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{field} not an integer"
    if not math.isfinite(value):
        return f"{field} not a finite number"
    if value != int(value):
        return f"{field} not an integer"
    if not low <= value <= high:
        return f"{field} not {low} or {high}" if high - low == 1 else f"{field} out of range [{low}, {high}]"
    return None


def score_fault(value: Any, field: str) -> Optional[Drop]:
    """None when `value` is a finite number (a score compared for ties), else the drop reason naming `field`."""
    if value is None:
        return f"{field} missing"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{field} not a number"
    if not math.isfinite(value):
        return f"{field} not a finite number"
    return None


def score_pair_fault(chosen: Any, rejected: Any, fields: tuple[str, str]) -> Optional[Drop]:
    """Optional score columns (RAIL, local files): no scores on a row is fine; one, or a bad one, is a fault."""
    if chosen is None and rejected is None:
        return None
    return score_fault(chosen, fields[0]) or score_fault(rejected, fields[1])


def _first_present(candidates: tuple[str, ...], columns: list[str]) -> Optional[str]:
    return next((c for c in candidates if c in columns), None)


# ---- helpful -----------------------------------------------------------------------------------------------
@register_source
class HelpSteer3Source(HubPreferenceSource):
    """nvidia/HelpSteer3 (preference): two responses to a chat context, rated -3..3."""

    name = "helpsteer3"
    category = "helpful"
    hub_id = "nvidia/HelpSteer3"
    hub_name = "preference"
    split_map = {"train": "train", "test": "validation"}  # no test split: validation serves as test
    required_columns = ("context", "response1", "response2", "overall_preference")

    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        preference = row["overall_preference"]
        fault = integer_label_fault(preference, "overall_preference", -3, 3)
        if fault:  # e.g. NaN, which compares as neither < 0 nor == 0, would silently pick response2
            return fault
        prompt = as_messages(row["context"])
        if prompt is None:
            return "malformed"
        if preference == 0:
            return "tie"
        # Negative: response1 is better; positive: response2 is better.
        first, second = row["response1"], row["response2"]
        chosen, rejected = (first, second) if preference < 0 else (second, first)
        return self.finish(split, prompt, chosen, rejected)


class _HHSource(HubPreferenceSource):
    """Anthropic/hh-rlhf: `chosen` and `rejected` are whole transcripts sharing the prompt."""

    hub_id = "Anthropic/hh-rlhf"
    split_map = {"train": "train", "test": "test"}
    required_columns = ("chosen", "rejected")

    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        chosen = split_hh_transcript(row["chosen"]) if isinstance(row["chosen"], str) else None
        rejected = split_hh_transcript(row["rejected"]) if isinstance(row["rejected"], str) else None
        if chosen is None or rejected is None:
            return "malformed"
        if chosen[0] != rejected[0]:
            return "prompt_mismatch"
        return self.finish(split, chosen[0], chosen[1], rejected[1])


@register_source
class HHHelpfulSource(_HHSource):
    name = "hh_helpful"
    category = "helpful"
    hub_data_dir = "helpful-base"


@register_source
class UltraFeedbackSource(HubPreferenceSource):
    """HuggingFaceH4/ultrafeedback_binarized: message lists whose last message is the response."""

    name = "ultrafeedback"
    category = "helpful"
    hub_id = "HuggingFaceH4/ultrafeedback_binarized"
    split_map = {"train": "train_prefs", "test": "test_prefs"}
    # `prompt` is only a fallback when the message lists hold no prompt turn, so it is not required.
    required_columns = ("chosen", "rejected", "score_chosen", "score_rejected")

    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        chosen, rejected = as_messages(row["chosen"]), as_messages(row["rejected"])
        if not chosen or not rejected or chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
            return "malformed"
        prompt = chosen[:-1]
        if prompt != rejected[:-1]:
            return "prompt_mismatch"
        if not prompt and isinstance(row.get("prompt"), str):
            prompt = [{"role": "user", "content": row["prompt"]}]
        fault = score_fault(row["score_chosen"], "score_chosen") or score_fault(row["score_rejected"], "score_rejected")
        if fault:  # NaN != NaN: a row without scores would pass as a preference
            return fault
        if row["score_chosen"] == row["score_rejected"]:
            return "tie"
        # prompt_id is a hash of the prompt, not of the row, so the id is the content hash.
        return self.finish(split, prompt, chosen[-1]["content"], rejected[-1]["content"])


# ---- harmless ----------------------------------------------------------------------------------------------
@register_source
class HHHarmlessSource(_HHSource):
    name = "hh_harmless"
    category = "harmless"
    hub_data_dir = "harmless-base"


@register_source
class PKUSafeRLHFSource(HubPreferenceSource):
    """PKU-Alignment/PKU-SafeRLHF: two responses per prompt; the harmless label is `safer_response_id`."""

    name = "pku_saferlhf"
    category = "harmless"
    hub_id = "PKU-Alignment/PKU-SafeRLHF"
    split_map = {"train": "train", "test": "test"}
    required_columns = ("prompt", "response_0", "response_1", "safer_response_id")

    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        safer = row["safer_response_id"]
        fault = integer_label_fault(safer, "safer_response_id", 0, 1)
        if fault:
            return fault
        if not isinstance(row["prompt"], str):
            return "malformed"
        safer = int(safer)
        prompt = [{"role": "user", "content": row["prompt"]}]
        return self.finish(split, prompt, row[f"response_{safer}"], row[f"response_{1 - safer}"])


@register_source
class RAILSource(HubPreferenceSource):
    """responsible-ai-labs/RAIL-HH-10K: HH-style context + prompt, and a chosen and a rejected answer.

    The answer column names are not verified against the hub, so they are resolved from the loaded schema
    among the candidates below; score columns (for ties) and an `id` column are used when present.
    """

    name = "rail"
    category = "harmless"
    hub_id = "responsible-ai-labs/RAIL-HH-10K"
    split_map = {"train": "train", "validation": "validation", "test": "test"}
    required_columns = ("prompt", "context")

    CHOSEN_CANDIDATES = ("chosen", "chosen_response", "response_chosen", "chosen_text", "chosen_answer")
    REJECTED_CANDIDATES = ("rejected", "rejected_response", "response_rejected", "rejected_text", "rejected_answer")
    CHOSEN_SCORE_CANDIDATES = ("chosen_score", "score_chosen", "chosen_rail_score")
    REJECTED_SCORE_CANDIDATES = ("rejected_score", "score_rejected", "rejected_rail_score")
    ID_CANDIDATES = ("id",)

    def resolve_columns(self, columns: list[str], origin: str) -> None:
        super().resolve_columns(columns, origin)
        self.chosen_column = _first_present(self.CHOSEN_CANDIDATES, columns)
        self.rejected_column = _first_present(self.REJECTED_CANDIDATES, columns)
        if self.chosen_column is None or self.rejected_column is None:
            raise DataError(
                f"{self.name}: cannot find the chosen/rejected answer columns in {origin}: expected one of "
                f"{list(self.CHOSEN_CANDIDATES)} and one of {list(self.REJECTED_CANDIDATES)}; "
                f"columns found: {sorted(columns)}"
            )
        self.scores = (
            _first_present(self.CHOSEN_SCORE_CANDIDATES, columns),
            _first_present(self.REJECTED_SCORE_CANDIDATES, columns),
        )
        self.id_column = _first_present(self.ID_CANDIDATES, columns)
        # Instance attribute: the base class then checks every row for the resolved columns too.
        self.required_columns = type(self).required_columns + (self.chosen_column, self.rejected_column)

    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        prompt = self._prompt(row["context"], row["prompt"])
        if prompt is None:
            return "malformed"
        chosen_score, rejected_score = (row.get(c) if c else None for c in self.scores)
        fault = score_pair_fault(chosen_score, rejected_score, self.scores) if all(self.scores) else None
        if fault:
            return fault
        if chosen_score is not None and chosen_score == rejected_score:
            return "tie"
        row_id = row.get(self.id_column) if self.id_column else None
        return self.finish(split, prompt, row[self.chosen_column], row[self.rejected_column], key=row_id)

    @staticmethod
    def _prompt(context: Any, prompt: Any) -> Optional[Messages]:
        """Context turns followed by the prompt as the last user turn (not repeated if context ends with it)."""
        if context is None:
            context = ""
        if not isinstance(context, str) or not isinstance(prompt, str):
            return None
        messages = parse_turns(context, _LINE_TURN)
        if messages is None:
            return None
        prompt = prompt.strip()
        if prompt and messages[-1:] != [{"role": "user", "content": prompt}]:
            messages.append({"role": "user", "content": prompt})
        return messages
