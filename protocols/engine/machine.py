"""The machine fingerprint a published set records: what can change a float result on CPU with the same code.

Two machines with the same fingerprint run the same kernels (same ISA paths, same thread count splitting the same
reductions, same library versions), so a rerun there should reproduce a table cell for cell; on a different one only
the claims are expected to hold (issue 50). `id` is a short hash of the rest, for a table row or a file name.
"""
from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from typing import Optional

# The flags that select a different kernel in oneDNN / MKL / PyTorch's CPU dispatch (AVX2 vs AVX-512 vs AMX paths,
# fused multiply-add, fp16/bf16 conversions); the hundred other flags do not change a result.
KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "amx_tile", "amx_bf16", "amx_int8")


def cpu_model(cpuinfo: str) -> Optional[str]:
    """The first `model name` of a /proc/cpuinfo text; None when it has none (not Linux x86)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return None


def kernel_flags(cpuinfo: str) -> list[str]:
    """The KERNEL_FLAGS present in the first `flags` line of a /proc/cpuinfo text, sorted."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            present = set(value.split())
            return sorted(f for f in KERNEL_FLAGS if f in present)
    return []


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def fingerprint_id(fields: dict) -> str:
    """12 hex digits of sha256 over the fields' sorted JSON (an `id` already among them is left out)."""
    body = {k: v for k, v in fields.items() if k != "id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def fingerprint(cpuinfo: Optional[str] = None, threads: Optional[int] = None) -> dict:
    """This process's machine: CPU model, kernel-relevant ISA flags, torch's thread count, library versions and an
    `id` hashing them. `cpuinfo` / `threads` replace what is read from the machine (tests)."""
    import torch

    text = _read_cpuinfo() if cpuinfo is None else cpuinfo
    fields = {
        "cpu": cpu_model(text) or platform.processor() or platform.machine() or "unknown",
        "flags": kernel_flags(text),
        "threads": torch.get_num_threads() if threads is None else threads,
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
    }
    return {**fields, "id": fingerprint_id(fields)}


def describe(fp: dict) -> str:
    """One line: 'AMD EPYC, avx2+fma, 2 threads, torch 2.x, transformers 4.x'."""
    flags = "+".join(fp.get("flags") or []) or "no kernel flags"
    threads = fp.get("threads")
    return (f"{fp.get('cpu')}, {flags}, {threads} thread{'' if threads == 1 else 's'}, torch {fp.get('torch')}, "
            f"transformers {fp.get('transformers')}")
