"""This CPU's measured fp32 matmul throughput at the benchmarks' thread count (the MFU denominator).

    .venv/bin/python benchmarks/matmul_peak.py

Prints one JSON line: the best median GFLOP/s over a few GEMM shapes (large squares and the reward model's own
tokens x 256 shapes), each shape's median, and the machine.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C  # noqa: E402

if __name__ == "__main__":
    C.offline_env()
    print(json.dumps({"bench": "matmul_peak", "machine": C.machine_info(), **C.matmul_peak()}))
