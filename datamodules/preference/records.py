"""The one record schema every preference source is normalised to.

A record is a plain dict (so it round-trips through `datasets` and jsonl unchanged):

    id        str   stable across runs: "<source>/<split>/<key>" where key comes from the row
    source    str   registry name of the source ("hh_helpful", "synth_helpful_cooking", ...)
    split     str   canonical split name: "train", "validation" or "test"
    prompt    list[{"role": str, "content": str}]   the conversation before the response
    chosen    str   the preferred response
    rejected  str   the other response
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

RECORD_KEYS = ("id", "source", "split", "prompt", "chosen", "rejected")
CANONICAL_SPLITS = ("train", "validation", "test")


def make_record(source: str, split: str, key: Any, prompt: list[dict], chosen: str, rejected: str) -> dict:
    return {
        "id": f"{source}/{split}/{key}",
        "source": source,
        "split": split,
        "prompt": [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt],
        "chosen": chosen,
        "rejected": rejected,
    }


def content_key(prompt: list[dict], chosen: str, rejected: str) -> str:
    """A short content hash: a stable id for rows that carry no id column of their own."""
    payload = json.dumps([prompt, chosen, rejected], ensure_ascii=False, sort_keys=True)
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:16]


def fingerprint(records: list[dict]) -> str:
    """Hash of a list of records (order-sensitive): keys caches of tokenized data and weak labels."""
    h = hashlib.sha1()
    for r in records:
        h.update(json.dumps([r[k] for k in RECORD_KEYS], ensure_ascii=False).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:20]
