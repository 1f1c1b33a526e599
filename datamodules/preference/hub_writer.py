"""Preference pairs written as rows of the real hub schemas that `sources/hub.py` reads (docs/hub_benchmarks.md).

One function per schema maps a pair -- {"prompt": messages ending on a user turn, "chosen", "rejected"} -- to that
schema's row, with the schema's quirks, drawing every coin (which side is `response1`, the scores) from a
`random.Random` of the row's own:

    hh_helpful     {"chosen", "rejected"}: whole "\\n\\nHuman: ...\\n\\nAssistant: ..." transcripts
    helpsteer3     context messages, response1 / response2 in either order, overall_preference in {±1, ±2, ±3}
                   (negative: response1 is preferred)
    ultrafeedback  prompt, prompt_id (sha256 of the prompt), chosen / rejected / messages message lists,
                   score_chosen > score_rejected (1-10, halves)
    rail           context (one "Human:" / "Assistant:" turn per line), prompt (the last user turn),
                   chosen_response / rejected_response, chosen_score > rejected_score (0-10) and two annotations

`hub_rows` writes a split: the pairs in order, plus about `BAD_RATE` of rows that the adapter must drop (ties,
exact duplicates, empty responses; hh has no scores, so identical responses instead of ties), built from spare
pairs and placed at seeded positions, so the adapter keeps exactly the given pairs.
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import Callable

Messages = list[dict]

BAD_RATE = 0.02
DROP_KINDS = {  # cycled in this order; "duplicate" copies a kept row, the others use a spare pair
    "hh_helpful": ("duplicate", "empty", "identical"),
    "helpsteer3": ("tie", "duplicate", "empty"),
    "ultrafeedback": ("tie", "duplicate", "empty"),
    "rail": ("tie", "duplicate", "empty"),
}
_HELPSTEER3_STRENGTHS = ((1, 2, 3), (0.45, 0.35, 0.2))  # |overall_preference|


def hh_transcript(messages: Messages) -> str:
    roles = {"user": "Human", "assistant": "Assistant"}
    return "".join(f"\n\n{roles[m['role']]}: {m['content']}" for m in messages)


def hh_row(pair: dict, rng: random.Random, tie: bool = False) -> dict:
    """Anthropic/hh-rlhf: both transcripts share the prompt turns (no label beyond which is `chosen`)."""
    prompt = pair["prompt"]
    return {"chosen": hh_transcript(prompt + [_assistant(pair["chosen"])]),
            "rejected": hh_transcript(prompt + [_assistant(pair["rejected"])])}


def helpsteer3_row(pair: dict, rng: random.Random, tie: bool = False) -> dict:
    """nvidia/HelpSteer3 (preference): the chosen response is response1 or response2 by a coin."""
    chosen_first = rng.random() < 0.5
    strength = rng.choices(*_HELPSTEER3_STRENGTHS)[0]
    preference = 0 if tie else (-strength if chosen_first else strength)
    first, second = (pair["chosen"], pair["rejected"]) if chosen_first else (pair["rejected"], pair["chosen"])
    return {"domain": "general", "language": "english", "context": pair["prompt"], "response1": first,
            "response2": second, "overall_preference": preference,
            "individual_preference": [{"score": preference, "reasoning": "synthetic", "feedback1": "",
                                       "feedback2": ""}]}


def ultrafeedback_row(pair: dict, rng: random.Random, tie: bool = False) -> dict:
    """HuggingFaceH4/ultrafeedback_binarized: message lists whose last message is the response."""
    rejected_score = rng.randrange(2, 17) / 2  # 1.0 .. 8.0
    chosen_score = rejected_score if tie else rng.randrange(int(rejected_score * 2) + 1, 21) / 2
    prompt_text = pair["prompt"][-1]["content"]
    chosen = pair["prompt"] + [_assistant(pair["chosen"])]
    return {"prompt": prompt_text, "prompt_id": hashlib.sha256(prompt_text.encode("utf-8")).hexdigest(),
            "chosen": chosen, "rejected": pair["prompt"] + [_assistant(pair["rejected"])], "messages": chosen,
            "score_chosen": chosen_score, "score_rejected": rejected_score}


def rail_row(pair: dict, rng: random.Random, tie: bool = False) -> dict:
    """responsible-ai-labs/RAIL-HH-10K: earlier turns as HH lines in `context`, the last user turn as `prompt`."""
    *earlier, last = pair["prompt"]
    roles = {"user": "Human", "assistant": "Assistant"}
    rejected_score = round(rng.uniform(0.5, 6.5), 1)
    chosen_score = rejected_score if tie else round(rng.uniform(rejected_score + 0.5, 10.0), 1)
    return {"context": "\n".join(f"{roles[m['role']]}: {m['content']}" for m in earlier), "prompt": last["content"],
            "chosen_response": pair["chosen"], "rejected_response": pair["rejected"],
            "chosen_score": chosen_score, "rejected_score": rejected_score,
            "chosen_safety": round(min(10.0, chosen_score + 1), 1),
            "rejected_safety": round(max(0.0, rejected_score - 1), 1)}


WRITERS: dict[str, Callable[..., dict]] = {
    "hh_helpful": hh_row,
    "helpsteer3": helpsteer3_row,
    "ultrafeedback": ultrafeedback_row,
    "rail": rail_row,
}


def n_bad(n_pairs: int) -> int:
    """Rows to drop written beside `n_pairs` kept pairs."""
    return int(round(BAD_RATE * n_pairs))


def spares_needed(schema: str, n_pairs: int) -> int:
    """Spare pairs `hub_rows` needs for the drop rows that are not duplicates (ties, empties, identicals)."""
    return sum(1 for i in range(n_bad(n_pairs)) if DROP_KINDS[schema][i % 3] != "duplicate")


def hub_rows(schema: str, pairs: list[dict], spares: list[dict], seed: str) -> tuple[list[dict], Counter]:
    """Rows of `schema` holding `pairs` (in order) plus `n_bad(len(pairs))` rows the adapter drops.

    Returns the rows and the expected drop counts by the adapter's reason ("tie", "duplicate", "empty",
    "identical"). Each row's coins come from `random.Random(f"{seed}/<row>")`.
    """
    if schema not in WRITERS:
        raise ValueError(f"no hub writer for {schema!r}; known: {sorted(WRITERS)}")
    write = WRITERS[schema]
    rows = [write(p, random.Random(f"{seed}/{i}")) for i, p in enumerate(pairs)]
    rng = random.Random(f"{seed}/bad")
    kinds = [DROP_KINDS[schema][i % 3] for i in range(n_bad(len(pairs)))]
    if sum(k != "duplicate" for k in kinds) > len(spares):
        raise ValueError(f"{schema}: {len(spares)} spare pairs for {len(kinds)} drop rows; see spares_needed")
    spare = iter(spares)
    for j, kind in enumerate(kinds):
        row_rng = random.Random(f"{seed}/bad/{j}")
        if kind == "duplicate":
            bad = dict(rows[rng.randrange(len(pairs))])  # an exact copy of a kept row (one of them is dropped)
        elif kind == "tie":
            bad = write(next(spare), row_rng, tie=True)
        elif kind == "identical":
            p = next(spare)
            bad = write({**p, "rejected": p["chosen"]}, row_rng)
        else:  # empty: one response blank or whitespace
            p = next(spare)
            blank = row_rng.choice(("", " ", "\n"))
            bad = write({**p, **({"chosen": blank} if row_rng.random() < 0.5 else {"rejected": blank})}, row_rng)
        rows.insert(rng.randrange(len(rows) + 1), bad)
    return rows, Counter(kinds)


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}
