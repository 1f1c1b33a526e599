"""Weak labels from a teacher checkpoint (docs/w2s.md) and the teacher's margins on every test split.

For each pair of the student half, the order (a, b) is a seeded coin per pair id (so q is not always > 0.5)
and q = σ(r_teacher(x, a) − r_teacher(x, b)). The teacher also scores every test split (a = chosen), so
teacher and student are later compared on exactly the same pairs.
Everything lands in one JSON file, keyed by the teacher checkpoint, the records, the teacher's tokenization
and the seed, written atomically: a second run (or every student of a protocol) reuses it.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
from typing import Optional

import torch

from datamodules.atomic_files import atomic_write_json
from datamodules.preference.collate import PairCollator
from datamodules.preference.pair_tokenization import PairTokenizer
from datamodules.preference.records import fingerprint

FORMAT_VERSION = 1


def swap_order(record_id: str, seed: int) -> bool:
    """The seeded 50/50 coin deciding whether a = rejected for this pair (independent of dataset order)."""
    digest = hashlib.sha1(f"{seed}:{record_id}".encode("utf-8")).digest()
    return digest[0] % 2 == 1


def checkpoint_key(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"


def weak_label_path(cache_dir: str, teacher_checkpoint: str, student_records: list[dict],
                    test_records: dict[str, list[dict]], seed: int, max_length: int, truncation: str) -> str:
    payload = json.dumps([FORMAT_VERSION, checkpoint_key(teacher_checkpoint), fingerprint(student_records),
                          {k: fingerprint(v) for k, v in sorted(test_records.items())}, seed, max_length, truncation])
    key = hashlib.sha1(payload.encode("utf-8")).hexdigest()[:20]
    return os.path.join(cache_dir, "weak_labels", f"{key}.json")


@torch.inference_mode()
def score_pairs(model, tokenizer, records: list[dict], swaps: list[bool], max_length: int, truncation: str,
                batch_size: int = 64) -> list[float]:
    """Teacher margins r(a) − r(b) for each record, where (a, b) = (rejected, chosen) when swapped."""
    tokenize = PairTokenizer(tokenizer, max_length, truncation)
    collate = PairCollator(tokenizer.pad_token_id, tokenizer.padding_side)
    margins: list[float] = [0.0] * len(records)
    # Length-sorted batches: little padding; results are written back in the records' order.
    enc = tokenize({k: [r[k] for r in records] for k in ("prompt", "chosen", "rejected")})
    order = sorted(range(len(records)), key=lambda i: -max(len(enc["a_input_ids"][i]), len(enc["b_input_ids"][i])))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        examples = []
        for i in idx:
            a, b = ("a", "b") if not swaps[i] else ("b", "a")
            examples.append({"a_input_ids": enc[f"{a}_input_ids"][i], "a_response_start": enc[f"{a}_response_start"][i],
                             "b_input_ids": enc[f"{b}_input_ids"][i], "b_response_start": enc[f"{b}_response_start"][i],
                             "index": i})
        batch = collate(examples)
        batch = {k: v.to(model.device) for k, v in batch.items()}
        for i, m in zip(idx, model.pair_margins(batch).float().cpu().tolist()):
            margins[i] = m
    return margins


def compute_weak_labels(teacher_checkpoint: str, student_records: list[dict], test_records: dict[str, list[dict]],
                        seed: int, max_length: int, truncation: str, out_path: str,
                        batch_size: int = 64, device: Optional[str] = None) -> dict:
    from datamodules.tokenizers import load_tokenizer
    from lightning_modules.reward.reward_model import RewardModelModule

    try:
        model = RewardModelModule.load_from_checkpoint(teacher_checkpoint, map_location="cpu")
    except (pickle.UnpicklingError, KeyError, RuntimeError, TypeError) as e:
        raise ValueError(f"--data.teacher_checkpoint {teacher_checkpoint!r} is not a RewardModelModule checkpoint "
                         f"of this version: {type(e).__name__}: {e}") from e
    model.eval().to(device or "cpu")
    tokenizer = load_tokenizer(model.tokenizer_name)
    swaps = [swap_order(r["id"], seed) for r in student_records]
    margins = score_pairs(model, tokenizer, student_records, swaps, max_length, truncation, batch_size)
    labels = {r["id"]: [float(torch.sigmoid(torch.tensor(m))), s] for r, m, s in zip(student_records, margins, swaps)}
    teacher_margins = {}
    for split, recs in test_records.items():
        m = score_pairs(model, tokenizer, recs, [False] * len(recs), max_length, truncation, batch_size)
        teacher_margins[split] = {r["id"]: v for r, v in zip(recs, m)}
    payload = {
        "meta": {"teacher_checkpoint": os.path.abspath(teacher_checkpoint), "seed": seed, "pairs": len(labels),
                 "teacher_tokenizer": model.tokenizer_name, "mean_q": sum(q for q, _ in labels.values()) / max(len(labels), 1),
                 "agreement_with_gold": gold_agreement(labels)},
        "labels": labels,
        "teacher_margins": teacher_margins,
    }
    atomic_write_json(payload, out_path, indent=None)  # large: no indentation
    return payload


def gold_agreement(labels: dict) -> float:
    """Share of pairs whose weak label picks the gold-chosen response (q > 0.5 exactly when a = chosen)."""
    return sum((q > 0.5) != bool(s) for q, s in labels.values()) / max(len(labels), 1)
