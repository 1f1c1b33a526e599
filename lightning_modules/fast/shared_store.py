"""Process-wide stores of frozen functions' outputs, keyed by what the function is and what it was given.

A frozen function of a fixed input needs one evaluation per process: the frozen prefix's hidden state k
(`frozen_prefix.py`) and the frozen ANCHOR reference's states at the anchored positions
(`callbacks/reference_model.py`) are the same in every epoch, split and stage that uses the same weights. Each store
is identified by a fingerprint of the function (`weights_fingerprint`), rows by a digest of their input
(`sequence_keys`), so a stage never reads another function's outputs. The W2S protocol frees every store when a
seed's data changes (`release_shared_stores`).
"""
from __future__ import annotations

import hashlib
import warnings
from typing import Iterable, Optional

import torch
from torch import nn


class Store:
    """Rows (host tensors, or tuples of them) by key, within a byte budget: the first row past it closes the store
    (one warning naming `flag`) and later rows are not kept."""

    def __init__(self, max_bytes: int, flag: str):
        self.rows: dict[bytes, object] = {}
        self.bytes, self.full, self.max_bytes, self.flag = 0, False, max_bytes, flag

    def get(self, key: bytes):
        return self.rows.get(key)

    def put(self, key: bytes, value) -> None:
        if self.full or key in self.rows:  # a sequence twice in one batch is kept once
            return
        tensors = value if isinstance(value, tuple) else (value,)
        size = sum(t.numel() * t.element_size() for t in tensors)
        if self.bytes + size > self.max_bytes:
            self.full = True
            warnings.warn(f"{self.flag}: the store reached its budget ({self.bytes / 2 ** 20:.1f} MiB, "
                          f"{len(self.rows)} sequences); further sequences are recomputed every time", stacklevel=3)
            return
        self.rows[key] = value
        self.bytes += size


_STORES: dict[tuple[str, str], Store] = {}


def shared_store(kind: str, fingerprint: str, max_bytes: int, flag: str) -> Store:
    """The process's store of `kind` for the function with this fingerprint (created on first use)."""
    key = (kind, fingerprint)
    if key not in _STORES:
        _STORES[key] = Store(max_bytes, flag)
    return _STORES[key]


def release_shared_stores() -> None:
    """Free every store of this process (the W2S protocol calls it when a seed's data changes)."""
    _STORES.clear()


def shared_store_bytes() -> int:
    return sum(store.bytes for store in _STORES.values())


def shared_store_summary() -> str:
    """One entry per store: kind, fingerprint prefix, sequences held, MiB, and whether it reached its budget."""
    return "; ".join(f"{kind} {fp[:8]}: {len(store.rows)} sequences, {store.bytes / 2 ** 20:.1f} MiB"
                     + (" (budget reached)" if store.full else "") for (kind, fp), store in _STORES.items())


def weights_fingerprint(modules: Iterable[nn.Module], config: Optional[object] = None, extra: str = "") -> str:
    """A digest of what a frozen function computes: its modules' parameters and buffers (names and bytes), the
    backbone config and `extra` (what else shapes it: layer counts, hooks)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(extra.encode())
    if config is not None:  # a transformers config, or anything with a faithful repr
        text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else repr(config)
        h.update(text.encode())
    for module in modules:
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def sequence_keys(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  select: Optional[torch.Tensor] = None) -> list[bytes]:
    """One key per row: a digest of its real positions, their token ids and (when given) the selected positions. A
    frozen function's output at real positions depends only on these (padding is masked out as a key), so equal keys
    mean equal outputs, whatever batch, split or stage the row comes from."""
    ids, real = input_ids.cpu(), attention_mask.bool().cpu()
    sel = None if select is None else select.bool().cpu()
    keys = []
    for r in range(len(ids)):
        pos = real[r].nonzero().squeeze(-1)  # (n_real,)
        h = hashlib.blake2b(digest_size=16)
        h.update(pos.numpy().tobytes())
        h.update(ids[r, pos].numpy().tobytes())
        if sel is not None:
            h.update(b"|" + sel[r].nonzero().squeeze(-1).numpy().tobytes())
        keys.append(h.digest())
    return keys
