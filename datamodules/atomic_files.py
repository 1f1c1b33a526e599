"""Files replaced in one step (temporary file + `os.replace`): a crash or a concurrent reader never sees a
half-written cache, label set, result or table. Shared by the data caches, the reward model's test results and
the protocols."""
from __future__ import annotations

import json
import os
from typing import Optional, Union


def atomic_write(path: str, data: Union[str, bytes]) -> None:
    """Replace `path` by `data` in one step (under DDP, callers write on global rank 0 only)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_json(payload: dict, path: str, indent: Optional[int] = 2) -> None:
    atomic_write(path, json.dumps(payload, indent=indent) + "\n")
