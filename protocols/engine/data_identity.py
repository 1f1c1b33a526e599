"""The data a protocol stage reads, as part of its identity (docs/reruns.md).

A stage's resolved configuration names its data by path or hub id; the *contents* behind those names can change
while the names stay (a fixed local file, a regenerated benchmark, a new hub revision). So the identity also holds:

- every local file or folder a data or model option points at (`--data.local_dirs`, `local:<path>` sources,
  `--data.question_dirs`, `--data.weak_labels`, a tokenizer or backbone directory, ...): size and SHA-256 of each
  file. Hashes are cached by (path, size, mtime) in `$SHIFTGEN_CACHE/file_digests.json`, so a 300k-pair file is
  hashed once, not on every run. That cache cannot see a file rewritten with its old size *and* mtime (`cp -p`,
  `touch -d`); `rehash_files()`, which a `--force` run calls, makes every later lookup of this process and of the
  processes it starts hash the files again (once each) and correct the cache;
- the synthetic generators' version: a hash of their code (their records are a function of their options, which
  are in the configuration, and of this code); for the trigger families, `datamodules.triggers.GENERATOR_VERSION`,
  which tests/test_trigger_family_files.py holds to the data the shipped families generate;
- a user's trigger family file and the question files it names (`--data.family path.yaml`): size and SHA-256, as
  above (a shipped family's name reads no file of the user's: its data is the generators' version);
- a hub dataset's resolved revision (the commit of its local cache or, online, of the hub), or "unresolved".

Upstream outputs (teacher checkpoint, a start checkpoint) are not fingerprinted here: the producing stage's identity
and run stand for them.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Optional

from datamodules.atomic_files import atomic_write_json
from datamodules.preference.prepared_index import file_sha256

# Flattened config keys whose string values are read as data or model files (the last dotted parts that matter).
READ_KEY = re.compile(r"(^|\.)(local_dirs\.[^.]+|question_dirs\.[^.]+|weak_labels|tokenizer|backbone|"
                      r"init_checkpoint|source|ood_targets\.\d+)$")
PATH_PREFIXES = ("local:", "hf_classifier:")
DIGEST_CACHE = "file_digests.json"
RACY_NS = 2_000_000_000
# Hashes made before this time (ns since the epoch) are not trusted: set by `rehash_files()`. An environment variable,
# so that the processes a run starts (a seed pool, a cluster job) distrust the same hashes.
REHASH_ENV = "SHIFTGEN_REHASH_SINCE_NS"
# (path, size, mtime_ns) -> (sha256, when it was hashed), for this process's lifetime
_HASHED_HERE: dict[tuple[str, int, int], tuple[str, int]] = {}


def _cache_path() -> str:
    from datamodules.preference.datamodule import default_cache_dir

    return os.path.join(default_cache_dir(), DIGEST_CACHE)


def rehash_files() -> None:
    """Distrust every file hash made before now, here and in the processes this one starts: each file is hashed again
    at its next lookup (once: the new hash is trusted for the rest of the run) and the cache file is corrected. A
    `--force` run calls it before any identity is computed, so it never trusts a hash that a rewrite with the old size
    and mtime would have left stale."""
    os.environ[REHASH_ENV] = str(time.time_ns())


def _rehash_since() -> int:
    value = os.environ.get(REHASH_ENV, "0")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${REHASH_ENV} must be a time in ns since the epoch (set by rehash_files), got {value!r}"
                         ) from None


def _trusted(st: os.stat_result, hashed_at: int) -> bool:
    """Whether a hash made at `hashed_at` for the file's current size and mtime still stands for it: made after the
    last `rehash_files()`, and when the file was already older than the hash by a margin -- a rewrite within the same
    timestamp tick keeps size and mtime (git's "racily clean" files), so a young file is hashed again."""
    return hashed_at >= _rehash_since() and st.st_mtime_ns < hashed_at - RACY_NS


class FileDigests:
    """SHA-256 of files, remembered by (absolute path, size, mtime_ns): a file is hashed again only when it
    changed, or when its hash predates `rehash_files()`. The cache is one small JSON file; concurrent writers can
    only lose entries, never corrupt it."""

    def __init__(self, path: Optional[str] = None):
        _rehash_since()  # a malformed value is refused here, whether or not a cached hash is ever looked up
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
        stat = [st.st_size, st.st_mtime_ns]
        seen = _HASHED_HERE.get((path, *stat))
        if seen is not None and _trusted(st, seen[1]):  # hashed by this process: every stage of a run reads the files
            self._remember(path, [*stat, *seen])
            return seen[0]
        hit = self.known.get(path)
        if hit and hit[:2] == stat and _trusted(st, hit[3]):
            return hit[2]
        hashed_at = time.time_ns()  # taken before reading: the racy margin then covers every byte read
        sha = file_sha256(path)
        _HASHED_HERE[(path, *stat)] = (sha, hashed_at)
        self._remember(path, [*stat, sha, hashed_at])
        return sha

    def _remember(self, path: str, entry: list) -> None:
        if self.known.get(path) != entry:
            self.known[path], self.dirty = entry, True

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
    paths = set(read_paths(flat_config, cwd or os.getcwd()).values())
    if _data_class(flat_config).endswith("TriggerDataModule"):
        from datamodules.triggers.family_files import files_read

        paths.update(files_read(flat_config.get("data.init_args.family"), cwd or os.getcwd()))
    for path in sorted(paths):
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
    from datamodules.preference.sources import SOURCES  # the package registers every built-in source

    local = {k.rsplit(".", 1)[-1] for k in flat if k.startswith("data.init_args.local_dirs.")}
    return [SOURCES[n] for n in _source_names(flat) if n in SOURCES and n not in local]


def _generators(flat: dict) -> dict[str, str]:
    """The version (code hash) of each generator whose records the stage reads."""
    from datamodules.preference.prepared_index import _generator_code
    from datamodules.preference.sources.synthetic import SyntheticShiftSource

    out = {}
    if _data_class(flat).endswith("TriggerDataModule"):
        from datamodules.triggers import GENERATOR_VERSION

        out["triggers"] = GENERATOR_VERSION
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
