"""What a prepared data module holds, remembered beside its tokenized cache, so that a later run with unchanged
inputs reloads the cache without reading, generating or fingerprinting the records again.

The tokenized splits are keyed by a fingerprint of their records; computing that fingerprint means loading every
record (reading 10^5 rows and normalising them, or regenerating the synthetic benchmark), which costs as much as a
third of the first preparation. The index maps the *inputs* -- the source files' names, sizes and SHA-256 of their
bytes, or the generator's code for the synthetic sources, plus every setting that picks records -- to the split
fingerprints, sizes and drop report of the run that loaded them. Sources whose rows cannot be pinned this way (hub
downloads) have no index: every run loads their records, as before.

The files are keyed by their contents, hashed here on every use, never by size and modification time alone: a file
rewritten with other rows but its old size and mtime (`cp -p`, `touch -d`, a restored backup) would otherwise be
served the old records' tokenized splits, and the number published from them would be the old data's (issue 34).
Hashing streams the bytes (about a second per GB), little next to parsing the records it lets a warm run skip.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

from datamodules.atomic_files import atomic_write_json

INDEX_VERSION = "2"  # 2: files keyed by (path, size, SHA-256), no longer by (path, size, mtime)
_CHUNK = 1 << 20


def file_sha256(path: str) -> str:
    """SHA-256 of a file's bytes, read a chunk at a time (a 300k-pair file is never held whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _source_files(path: str) -> list[tuple[str, str]]:
    """(relative path, absolute path) of a file, or of every file under a directory, in a stable order. Dotfiles and
    dot-directories are skipped (no source reads them; a download's `.cache/` would only cost hashing)."""
    if os.path.isfile(path):
        return [(os.path.basename(path), path)]
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                full = os.path.join(root, name)
                out.append((os.path.relpath(full, path), full))
    return out


def _file_contents(path: str) -> list:
    """[relative path, size, sha256] of a file, or of every file under a directory: what its rows are made of."""
    return [[rel, os.path.getsize(full), file_sha256(full)] for rel, full in _source_files(path)]


def code_hash(*modules) -> str:
    """Hash of the modules' source files (a generator's version: its records are a function of options and code)."""
    h = hashlib.sha1()
    for module in modules:
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _generator_code() -> str:
    """Hash of the synthetic benchmark's code: its records are a function of its options and this code."""
    from datamodules.preference import records, synthetic_lexicon, synthetic_shift
    from datamodules.preference.sources import synthetic

    return code_hash(synthetic_shift, synthetic_lexicon, synthetic, records)


def source_identity(name: str, local_dir: Optional[str]) -> Optional[list]:
    """What pins a source's rows: its files' contents, or the generator's code; None when nothing does (the hub)."""
    from datamodules.preference.sources import SOURCE_PREFIXES, SOURCES
    from datamodules.preference.sources.synthetic import SyntheticShiftSource

    if local_dir is not None:
        return ["files", os.path.abspath(local_dir), _file_contents(local_dir)] if os.path.exists(local_dir) else None
    for prefix in SOURCE_PREFIXES:
        if name.startswith(prefix):
            path = name[len(prefix):]
            return ["files", os.path.abspath(path), _file_contents(path)] if os.path.exists(path) else None
    cls = SOURCES.get(name)
    if cls is not None and issubclass(cls, SyntheticShiftSource):
        return ["generated", _generator_code()]
    return None


def index_path(cache_dir: str, names: list[str], local_dirs: dict, settings: dict[str, Any]) -> Optional[str]:
    """Path of the index for these inputs and settings; None when some source cannot be pinned."""
    identities = []
    for name in names:
        ident = source_identity(name, local_dirs.get(name))
        if ident is None:
            return None
        identities.append([name, ident])
    payload = json.dumps([INDEX_VERSION, identities, settings], sort_keys=True, default=str)
    key = hashlib.sha1(payload.encode("utf-8")).hexdigest()[:20]
    return os.path.join(cache_dir, "prepared", f"{key}.json")


def read_index(path: Optional[str]) -> Optional[dict]:
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):  # a damaged index only costs a full load
        return None


def write_index(path: Optional[str], fingerprints: dict[str, str], sizes: dict[str, int], report: dict,
                chosen_by: Optional[str] = None) -> None:
    """Write the index atomically (`chosen_by`: the flag that chose the cache directory, named if the write fails)."""
    if path is None:
        return
    atomic_write_json({"fingerprints": fingerprints, "sizes": sizes, "report": report}, path, indent=None,
                      chosen_by=chosen_by)
