"""The data a protocol stage reads, as part of its identity (docs/reruns.md).

A stage's resolved configuration names its data by path or hub id; the *contents* behind those names can change
while the names stay (a fixed local file, a regenerated benchmark, a new hub revision). So the identity also holds:

- every local file or folder a data or model option points at (`--data.local_dirs`, `local:<path>` sources,
  `--data.question_dirs`, `--data.weak_labels`, a tokenizer or backbone directory, ...): size and SHA-256 of each
  file. Hashes are cached by (path, size, mtime) in `$SHIFTGEN_CACHE/file_digests.json`, so a 300k-pair file is
  hashed once, not on every run;
- the synthetic generators' version: a hash of their code (their records are a function of their options, which
  are in the configuration, and of this code);
- a hub dataset's resolved revision (the commit of its local cache or, online, of the hub), or "unresolved".

Upstream outputs (teacher checkpoint, a start checkpoint) are not fingerprinted here: the producing stage's identity
and run stand for them.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from typing import Any, Optional

from datamodules.atomic_files import atomic_write_json

# Flattened config keys whose string values are read as data or model files (the last dotted parts that matter).
READ_KEY = re.compile(r"(^|\.)(local_dirs\.[^.]+|question_dirs\.[^.]+|weak_labels|tokenizer|backbone|"
                      r"init_checkpoint|source|ood_targets\.\d+)$")
PATH_PREFIXES = ("local:", "hf_classifier:")
DIGEST_CACHE = "file_digests.json"
_CHUNK = 1 << 20
RACY_NS = 2_000_000_000
# (path, size, mtime_ns) -> (sha256, when it was hashed), for this process's lifetime
_HASHED_HERE: dict[tuple[str, int, int], tuple[str, int]] = {}


def _cache_path() -> str:
    from datamodules.preference.datamodule import default_cache_dir

    return os.path.join(default_cache_dir(), DIGEST_CACHE)


class FileDigests:
    """SHA-256 of files, remembered by (absolute path, size, mtime_ns): a file is hashed again only when it
    changed. The cache is one small JSON file; concurrent writers can only lose entries, never corrupt it."""

    def __init__(self, path: Optional[str] = None):
        self.path = path or _cache_path()
        try:
            with open(self.path) as f:
                self.known: dict[str, list] = json.load(f)
        except (OSError, ValueError):
            self.known = {}
        self.dirty = False

    def digest(self, path: str) -> str:
        path = os.path.abspath(path)
        st = os.stat(path)
        seen = _HASHED_HERE.get((path, st.st_size, st.st_mtime_ns))
        if seen is not None:  # hashed by this process already: every stage of a run reads the same files
            entry = [st.st_size, st.st_mtime_ns, *seen]
            if self.known.get(path) != entry:
                self.known[path], self.dirty = entry, True
            return seen[0]
        hit = self.known.get(path)
        # Trusted only when the file was already older than the hash by a margin: a rewrite within the same
        # timestamp tick keeps size and mtime (git's "racily clean" files), so a young file is hashed again.
        if hit and hit[:2] == [st.st_size, st.st_mtime_ns] and st.st_mtime_ns < hit[3] - RACY_NS:
            return hit[2]
        hashed_at = time.time_ns()
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(_CHUNK), b""):
                h.update(block)
        self.known[path] = [st.st_size, st.st_mtime_ns, h.hexdigest(), hashed_at]
        self.dirty = True
        _HASHED_HERE[(path, st.st_size, st.st_mtime_ns)] = (h.hexdigest(), hashed_at)
        return h.hexdigest()

    def tree(self, path: str) -> dict[str, str]:
        """{absolute file path: "<size> bytes sha256:<hex>"} of a file, or of every file under a folder (dotfiles
        skipped): a change then names the file itself."""
        paths = [path]
        if not os.path.isfile(path):
            paths = []
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                paths += [os.path.join(root, name) for name in sorted(files) if not name.startswith(".")]
        return {os.path.abspath(p): f"{os.path.getsize(p)} bytes sha256:{self.digest(p)[:16]}" for p in paths}

    def save(self) -> None:
        if self.dirty:
            try:
                atomic_write_json(self.known, self.path, indent=None)
            except OSError:  # a read-only or full cache only costs hashing again next time
                pass
            self.dirty = False


def read_paths(flat_config: dict[str, Any], cwd: str) -> dict[str, str]:
    """{config key: absolute path} of the existing local files and folders the stage's options point at."""
    found = {}
    for key, value in flat_config.items():
        if not isinstance(value, str) or not READ_KEY.search(key):
            continue
        if re.search(r"(^|\.)(source|ood_targets\.\d+)$", key) and not value.startswith("local:"):
            continue  # a registered source name, not a path
        for prefix in PATH_PREFIXES:
            if value.startswith(prefix):
                value = value[len(prefix):]
        path = os.path.abspath(os.path.join(cwd, os.path.expanduser(value)))
        if value and os.path.exists(path):
            found[key] = path
    return found


def data_identity(flat_config: dict[str, Any], cwd: Optional[str] = None,
                  digests: Optional[FileDigests] = None) -> dict:
    """{"files": {path: "<size> bytes sha256:<hex>"}, "generators": {...}, "hub": {...}} of one stage.

    `flat_config`: the stage's resolved configuration, flattened and without location or upstream keys
    (`stage_identity.without_location`); `cwd`: the folder its relative paths are read from."""
    own = digests is None
    digests = digests or FileDigests()
    files: dict[str, str] = {}
    for path in sorted(set(read_paths(flat_config, cwd or os.getcwd()).values())):
        files.update(digests.tree(path))
    if own:
        digests.save()
    identity: dict[str, Any] = {"files": files}
    generators = _generators(flat_config)
    if generators:
        identity["generators"] = generators
    hub = _hub_revisions(flat_config)
    if hub:
        identity["hub"] = hub
    return identity


def _data_class(flat: dict) -> str:
    return str(flat.get("data.class_path", ""))


def _source_names(flat: dict) -> list[str]:
    names = [flat.get("data.init_args.source")]
    names += [v for k, v in sorted(flat.items()) if re.fullmatch(r"data\.init_args\.ood_targets\.\d+", k)]
    return [n for n in names if isinstance(n, str)]


def _registered_sources(flat: dict) -> list[type]:
    """The registered classes of the stage's sources that no local folder replaces (generated or read from the hub)."""
    from datamodules.preference.sources.base import SOURCES, _import_builtin_sources

    _import_builtin_sources()
    local = {k.rsplit(".", 1)[-1] for k in flat if k.startswith("data.init_args.local_dirs.")}
    return [SOURCES[n] for n in _source_names(flat) if n in SOURCES and n not in local]


def _generators(flat: dict) -> dict[str, str]:
    """The version (code hash) of each generator whose records the stage reads."""
    from datamodules.preference.prepared_index import _generator_code, code_hash
    from datamodules.preference.sources.synthetic import SyntheticShiftSource

    out = {}
    if _data_class(flat).endswith("TriggerDataModule"):
        from datamodules.triggers import families, question_fixtures, questions

        out["triggers"] = code_hash(families, questions, question_fixtures)
    if any(issubclass(cls, SyntheticShiftSource) for cls in _registered_sources(flat)):
        out["synthetic_shift"] = _generator_code()
    return out


def _hub_revisions(flat: dict) -> dict[str, str]:
    """Hub datasets read by id (no local folder given): their resolved revision."""
    return {cls.hub_id: hub_revision(cls.hub_id) for cls in _registered_sources(flat) if getattr(cls, "hub_id", "")}


def hub_revision(repo_id: str) -> str:
    """The commit a hub dataset resolves to: its local cache's `refs/main`, else the hub's answer when online, else
    "unresolved" (offline and never downloaded: the stage itself will fail to load it)."""
    try:
        from huggingface_hub import constants

        ref = os.path.join(constants.HF_HUB_CACHE, "datasets--" + repo_id.replace("/", "--"), "refs", "main")
        with open(ref) as f:
            return f.read().strip()
    except (OSError, ImportError):
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return "unresolved"
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(repo_id).sha or "unresolved"
    except Exception:  # noqa: BLE001 -- no network, no such dataset, rate limit: the stage's own load says why
        return "unresolved"
