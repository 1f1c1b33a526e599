"""Base class and registry for preference sources.

A source knows where its rows live (a hub id, or local jsonl/parquet files in the same schema) and how to
turn one raw row into a record of `datamodules.preference.records` -- or into the reason it is dropped.

This module knows no source: each registers itself on import (`@register_source`, or its prefix in
`SOURCE_PREFIXES`), and the package `datamodules.preference.sources` imports the built-in ones after this module.
Python runs the package before any import of this module returns, so the registry is full when it is read.
"""
from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Iterator, Optional, Union
from urllib.parse import quote, unquote

from datamodules.preference.records import CANONICAL_SPLITS


class DataError(ValueError):
    """Bad input data: the message names the source, file, row or column at fault."""


@dataclass
class SourceSplit:
    records: list[dict]
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    origin: str = ""  # where the rows came from (file path or hub id), for messages and reports


SOURCES: dict[str, type["PreferenceSource"]] = {}
# Sources named by a prefix and a path ("local:/data/prefs.jsonl"): prefix -> class built from the whole name.
SOURCE_PREFIXES: dict[str, type["PreferenceSource"]] = {}


def register_source(cls: type["PreferenceSource"]) -> type["PreferenceSource"]:
    if cls.name in SOURCES:
        raise ValueError(f"preference source {cls.name!r} registered twice")
    SOURCES[cls.name] = cls
    return cls


def build_source(name: str, local_dir: Optional[str] = None, **options: Any) -> "PreferenceSource":
    """Instantiate a registered source by name (`local_dir`: files instead of the hub)."""
    for prefix, cls in SOURCE_PREFIXES.items():
        if name.startswith(prefix):
            return cls(name, local_dir=local_dir, **options)
    if name not in SOURCES:
        raise DataError(f"unknown preference source {name!r}; {known_sources_hint()}")
    return SOURCES[name](local_dir=local_dir, **options)


def is_known_source(name: str) -> bool:
    """A registered name, or a name of a registered prefix (`local:<path>`; the path is checked when loading)."""
    return name in SOURCES or any(name.startswith(p) and len(name) > len(p) for p in SOURCE_PREFIXES)


def known_sources_hint() -> str:
    forms = "".join(f", or {p}<path>" for p in SOURCE_PREFIXES)
    return f"known sources: {sorted(SOURCES)}{forms}"


def _import_builtin_sources() -> None:
    """Nothing left to do: the package imported the built-in sources before this module could be reached (see the
    module's docstring). Kept for callers written when this imported them (protocols/engine/data_identity.py)."""


Drop = str  # a normalize() result that is a string is the reason the row was dropped


class PreferenceSource:
    """One preference dataset. Subclasses set the class attributes and implement `normalize`.

    Args:
        local_dir: a directory holding one file per split, named after the hub split or the canonical split
            (`train.jsonl`, `test_prefs.parquet`, ...), in the hub schema. `None` loads `hub_id` from the hub.
    """

    name: ClassVar[str]
    category: ClassVar[str]  # "helpful" or "harmless"
    hub_id: ClassVar[str] = ""
    hub_name: ClassVar[Optional[str]] = None  # the `name=` (config) argument of load_dataset
    hub_data_dir: ClassVar[Optional[str]] = None  # the `data_dir=` argument of load_dataset
    split_map: ClassVar[dict[str, str]] = {"train": "train", "test": "test"}  # canonical -> hub split
    required_columns: ClassVar[tuple[str, ...]] = ()
    # A null in a required column: refused like a missing one (True: the user's own files, where it is a mistake),
    # or left to `normalize`, which drops the row as malformed (False: the hub datasets, whose schema fills gaps
    # with nulls and whose known bad rows are dropped and counted).
    null_is_missing: ClassVar[bool] = False

    def __init__(self, local_dir: Optional[str] = None):
        self.local_dir = local_dir

    # ---- what subclasses implement -------------------------------------------------------------------
    def normalize(self, row: dict, key: Any, split: str) -> Union[dict, Drop]:
        raise NotImplementedError

    def resolve_columns(self, columns: list[str], origin: str) -> None:
        """Check the loaded schema (override to resolve unverified column names)."""
        missing = [c for c in self.required_columns if c not in columns]
        if missing:
            raise DataError(
                f"{self.name}: {origin} is missing column(s) {missing}; columns found: {sorted(columns)}"
            )

    # ---- subsets: per-subset accuracy in `cli.py test` (RewardBench's subsets, a local file's `subset` column) --
    subset_keys: ClassVar[bool] = False  # True: record keys are `subset_key(subset, row_key)`

    def subset_of(self, record_id: str) -> Optional[str]:
        """The subset of one of this source's records (from its id), or None when the source has no subsets."""
        if not self.subset_keys:
            return None
        key = record_id[len(self.name) + 1:].split("/", 1)[1]  # "<name>/<split>/<key>"; names may hold "/"
        return parse_subset_key(key)

    def summarize_subsets(self, subsets: dict[str, dict]) -> dict:
        """Scores a source defines over its per-subset accuracies (RewardBench: its sections); none by default."""
        return {}

    # ---- shared machinery ------------------------------------------------------------------------------
    def available_splits(self) -> list[str]:
        return [s for s in CANONICAL_SPLITS if s in self.split_map]

    def load(self, split: str) -> SourceSplit:
        if split not in self.split_map:
            raise DataError(
                f"{self.name} has no {split!r} split (it has {self.available_splits()}); "
                "the data module carves a validation split from train when a source has none"
            )
        rows, origin = self._read_rows(split)
        rows = iter(rows)  # streamed: a raw row is dropped once normalized, not held with the whole file's rows
        first = next(rows, None)
        if first is None:
            raise DataError(f"{self.name}: split {split!r} from {origin} has no rows")
        self.resolve_columns(list(first.keys()), origin)
        out = SourceSplit(records=[], origin=origin)
        for i, row in enumerate(itertools.chain([first], rows)):
            missing = [c for c in self.required_columns
                       if c not in row or (self.null_is_missing and row[c] is None)]
            if missing:
                where = rows.where() if isinstance(rows, TableRows) else f"row {i + 1} of {origin}"
                absent = "missing or null" if self.null_is_missing else "missing"
                raise DataError(f"{self.name}: {where}: column(s) {missing} {absent}; every row needs "
                                f"{list(self.required_columns)}")
            result = self.normalize(row, i, split)
            if isinstance(result, str):
                out.dropped[result] += 1
            else:
                out.records.append(result)
        if not out.records:
            raise DataError(
                f"{self.name}: split {split!r} from {origin} is empty after filtering "
                f"({i + 1} rows, dropped: {dict(out.dropped)})"
            )
        return out

    def _read_rows(self, split: str) -> tuple[Iterable[dict], str]:
        hub_split = self.split_map[split]
        if self.local_dir is not None:
            path = find_split_file(self.local_dir, [hub_split, split], self.name)
            return iter_table(path), path
        return self._load_hub(hub_split), f"hub dataset {self.hub_id}"

    def _load_hub(self, hub_split: str) -> Iterator[dict]:
        import datasets

        try:
            ds = datasets.load_dataset(
                self.hub_id, name=self.hub_name, data_dir=self.hub_data_dir, split=hub_split
            )
        except Exception as err:  # offline, missing from the cache, network failure, ...
            raise DataError(
                f"{self.name}: could not load {self.hub_id!r} (split {hub_split!r}) from the hub: "
                f"{type(err).__name__}: {str(err)[:300]}\n"
                f"Without network, point the loader at local files in the same schema: "
                f"--data.local_dirs '{{\"{self.name}\": \"/path/to/dir\"}}' with one file per split named "
                f"{sorted(set(self.split_map.values()))} (.jsonl or .parquet)."
            ) from err
        return _dataset_rows(ds)


def _dataset_rows(ds, batch_size: int = 1024) -> Iterator[dict]:
    """A `datasets.Dataset`'s rows as dicts, decoded a batch at a time (not the whole split as one list)."""
    for batch in ds.iter(batch_size=batch_size):
        columns = list(batch)
        yield from (dict(zip(columns, values)) for values in zip(*(batch[c] for c in columns)))


def subset_key(subset: Optional[str], row_key: Any) -> str:
    """A record key that carries its subset: both parts quoted, so the key holds a "/" only between them."""
    row = quote(str(row_key), safe="")
    return row if subset is None else f"{quote(subset, safe='')}/{row}"


def parse_subset_key(key: str) -> Optional[str]:
    return unquote(key.split("/", 1)[0]) if "/" in key else None


def find_split_file(directory: str, stems: list[str], source: str) -> str:
    if not os.path.isdir(directory):
        raise DataError(f"{source}: local data directory {directory!r} does not exist")
    for stem in dict.fromkeys(stems):
        for ext in (".jsonl", ".json", ".parquet"):
            path = os.path.join(directory, stem + ext)
            if os.path.isfile(path):
                return path
    raise DataError(
        f"{source}: no file for split {stems[-1]!r} in {directory!r}: expected one of "
        f"{[s + e for s in dict.fromkeys(stems) for e in ('.jsonl', '.json', '.parquet')]}; "
        f"found {sorted(os.listdir(directory))}"
    )


_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, which some Windows editors put at the start of a file


class TableRows:
    """The rows of a jsonl / json-lines / JSON-array or parquet file, one at a time (parquet a batch at a time), so
    the raw file is never held whole; `where()` says where the last row given came from, counted as an editor
    counts (from 1): "line 4 of FILE" (blank lines count), "item 4 of the JSON array in FILE", "row 4 of FILE"."""

    def __init__(self, path: str):
        self.path = path
        self._unit, self._number = "row", 0
        self._rows = self._read()

    def __iter__(self) -> "TableRows":
        return self

    def __next__(self) -> dict:
        return next(self._rows)

    def where(self) -> str:
        if self._unit == "item":
            return f"item {self._number} of the JSON array in {self.path}"
        return f"{self._unit} {self._number} of {self.path}"

    def _read(self) -> Iterator[dict]:
        path = self.path
        if path.endswith(".json") and _starts_with(path, b"["):
            self._unit = "item"
            for self._number, row in enumerate(_read_json_array(path), start=1):
                yield row
            return
        if path.endswith(".parquet"):
            for self._number, row in enumerate(_parquet_rows(path), start=1):
                yield row
            return
        self._unit = "line"
        yield from _jsonl_rows(path, self)


def iter_table(path: str) -> TableRows:
    """Rows of a jsonl / json-lines / JSON-array or parquet file (`TableRows`). A malformed line or a byte that is
    not UTF-8 is reported with its file, line and column; a UTF-8 byte-order mark is skipped."""
    return TableRows(path)


def _jsonl_rows(path: str, cursor: TableRows) -> Iterator[dict]:
    with open(path, "rb") as f:  # bytes, split on "\n" only: a bad byte is then located by line, not by read chunk
        offset = 0  # of the line in the file
        for lineno, raw in enumerate(f, start=1):
            skip = len(_BOM) if lineno == 1 and raw.startswith(_BOM) else 0
            try:
                line = raw[skip:].decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(path, raw[skip:], lineno, offset + skip, err.start, err.reason) from None
            offset += len(raw)
            line = line.rstrip("\r\n")  # kept, the newline puts an unclosed object's fault at "column 1" of line 2
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: malformed JSON line ({_json_fault(err)})") from err
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
            cursor._number = lineno
            yield row


def _not_utf8(path: str, line: bytes, lineno: int, line_offset: int, start: int, reason: str) -> DataError:
    """The error for a byte that is not UTF-8 at `line[start]` (line `lineno`, starting at byte `line_offset`)."""
    column = len(line[:start].decode("utf-8", errors="replace")) + 1  # in characters, as an editor counts
    return DataError(
        f"{path}:{lineno}: not UTF-8 text: byte 0x{line[start]:02x} at column {column} "
        f"(byte offset {line_offset + start} in the file; {reason}); save the file as UTF-8 "
        "(e.g. `iconv -f latin1 -t utf-8`)"
    )


def _json_fault(err: json.JSONDecodeError) -> str:
    msg = err.msg[:-3] if err.msg.endswith(" at") else err.msg  # "Invalid control character at"
    return f"{msg} at column {err.colno}"


def _parquet_rows(path: str, batch_size: int = 2048) -> Iterator[dict]:
    import pyarrow.parquet as pq

    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            yield from batch.to_pylist()
    except Exception as err:
        raise DataError(f"{path}: cannot read parquet: {err}") from err


def _starts_with(path: str, prefix: bytes) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096)
    return head.removeprefix(_BOM).lstrip().startswith(prefix)


def _read_json_array(path: str) -> list[dict]:
    """A .json file holding one JSON array of row objects (what `json.dump(rows)` or pandas' `to_json` write)."""
    with open(path, "rb") as f:
        data = f.read()
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        text = data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = skip + err.start
        line_start = data.rfind(b"\n", 0, at) + 1 or skip
        line = data[line_start:].split(b"\n", 1)[0]
        raise _not_utf8(path, line, data.count(b"\n", 0, at) + 1, line_start, at - line_start, err.reason) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: malformed JSON ({_json_fault(err)})") from err
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataError(f"{path}: item {bad} of the JSON array is a {type(rows[bad]).__name__}, not an object")
    return rows
