"""Collate tokenized pairs into one padded batch of 2B sequences (a's first, then b's): one backbone forward.

Padding is to the longest sequence of the batch, on the tokenizer's padding side. `response_mask` marks the
response tokens (for ANCHOR); `labels` is q = P(a ≻ b) (1.0 for gold pairs); `index` the pair's position in
its split (for exact DDP metrics); `teacher_labels` (B, K+1), with extra teachers only, every teacher's q of the
pair (column 0 the main teacher's).
"""
from __future__ import annotations

import torch


class PairCollator:
    """Args:
        pad_token_id: id written in padded positions.
        padding_side: "right" or "left".
    """

    def __init__(self, pad_token_id: int, padding_side: str = "right"):
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding side must be 'left' or 'right', got {padding_side!r}")
        self.pad_token_id, self.padding_side = pad_token_id, padding_side

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        seqs = [(e["a_input_ids"], e["a_response_start"]) for e in examples]
        seqs += [(e["b_input_ids"], e["b_response_start"]) for e in examples]
        width = max(len(ids) for ids, _ in seqs)
        n = len(seqs)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)  # (2B, T)
        attention_mask = torch.zeros((n, width), dtype=torch.long)  # (2B, T)
        response_mask = torch.zeros((n, width), dtype=torch.long)  # (2B, T)
        for row, (ids, start) in enumerate(seqs):
            offset = width - len(ids) if self.padding_side == "left" else 0
            input_ids[row, offset:offset + len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, offset:offset + len(ids)] = 1
            response_mask[row, offset + start:offset + len(ids)] = 1
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "labels": torch.tensor([float(e.get("label", 1.0)) for e in examples], dtype=torch.float32),
            "index": torch.tensor([int(e["index"]) for e in examples], dtype=torch.long),
        }
        if "teacher_labels" in examples[0]:  # several teachers' q of the same (a, b): main teacher first
            batch["teacher_labels"] = torch.tensor([e["teacher_labels"] for e in examples],
                                                   dtype=torch.float32)  # (B, K+1)
        if "teacher_margin" in examples[0]:  # the teacher's margin on the same test pair (W2S evaluation)
            batch["teacher_margin"] = torch.tensor([float(e["teacher_margin"]) for e in examples])
        return batch
