"""Where the data side caches (tokenized splits, the prepared index, built tokenizers), and what chose it: the flag,
`$SHIFTGEN_CACHE` or the default -- named by every failed cache write so the user knows what to change."""
from __future__ import annotations

import os
from typing import Optional

ENV = "SHIFTGEN_CACHE"


def resolve_cache_dir(explicit: Optional[str] = None, flag: str = "--data.cache_dir") -> tuple[str, str]:
    """(cache directory, what chose it): `explicit` (given by `flag`), else $SHIFTGEN_CACHE, else ~/.cache/shiftgen."""
    if explicit:
        return explicit, flag
    if os.environ.get(ENV):
        return os.environ[ENV], f"${ENV}"
    return (os.path.join(os.path.expanduser("~"), ".cache", "shiftgen"),
            f"the default ~/.cache/shiftgen (set {flag} or ${ENV} to move it)")
