"""A published results set belongs to one protocol configuration and to the stage runs it was made from.

`run_files.publish_set` swaps a set in whole; this module says *whose* set it is and whether it is still true:

- **Owner.** A set holds the protocol configuration that made it (`protocol.json`). A run of another configuration
  (other methods, seeds, config files; the out_dir aside) is refused before any work instead of silently replacing
  the set's rows: it names both configurations and the ways out (its own `results_name`, `--replace_results`,
  another out_dir). An option added to the code since, at its declared default, is no change.
- **Stages.** A set records each stage it read (`set.json`: result file, identity digest, run id). A reader
  (`load_published`: `regime_table`, `join_rows`, `lambda_curve`, `--status`) refuses a set whose stages are gone or
  ran again since, naming them.
- **Withdrawal.** When a run is about to rerun a stage that a published set read (`--force`, a lost checkpoint), it
  withdraws that set at once (`withdraw_sets_reading`): the set moves to `<name>.stale/` with a note saying why, and
  its stable names (`results.md` ...) go, so a failed rerun never leaves the old table reading as the result.
- **Across folders.** A set also records each stage's result file by its real path, and each of those files gets a
  line naming the set (`.<result file>.read_by` beside it, appended: `register_readers`). A rerun of the stage from
  anywhere -- another configuration whose seed folders link to these, the same stage reached through a link,
  another experiment of the mixture's family -- reads those lines and withdraws every set that still records that
  file (`withdraw_sets_reading_file`), in whatever out_dir it lives.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Optional

from protocols.engine.run_files import read_json
from protocols.engine.stage_identity import digest, identity_diff

SET_RECORD = "set.json"  # inside the set: its owner's command, its stable names, the stages it read
STALE_SUFFIX = ".stale"
STALE_NOTE = "STALE.md"
PROTOCOL_LOCATION_KEYS = ("out_dir",)  # where a run writes, not what it is


class PublishedSetError(RuntimeError):
    """A published set that cannot be read as a result (missing, stale, or another configuration's)."""


# ---- what a set records -------------------------------------------------------------------------------------------
def stage_entry(out_dir: str, result_path: str, result: dict) -> dict:
    """A stage's line in `set.json`: its result file (relative to out_dir, and by its real path: a linked seed
    folder's stage is another configuration's too), identity digest and run."""
    return {"result": os.path.relpath(result_path, out_dir), "real": os.path.realpath(result_path),
            "identity": digest(result.get("identity") or {}), "run": result.get("run")}


READ_BY = ".{}.read_by"  # beside a stage's result file: the real paths of the sets that read it, one per line


def register_readers(set_dir: str, stages: dict[str, dict]) -> None:
    """After publishing `set_dir`: a line naming it beside each stage result it read (appended in one write, so
    publishers of two configurations sharing a stage never lose each other's line). A line outlives its set; the
    withdrawal checks the set's own record first."""
    line = (os.path.realpath(set_dir) + "\n").encode()
    for entry in stages.values():
        real = entry.get("real")
        if not real or not os.path.isdir(os.path.dirname(real)) or line.decode().strip() in _readers(real):
            continue
        fd = os.open(_read_by(real), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _read_by(real: str) -> str:
    return os.path.join(os.path.dirname(real), READ_BY.format(os.path.basename(real)))


def _readers(real: str) -> list[str]:
    try:
        with open(_read_by(real), encoding="utf-8") as f:
            return list(dict.fromkeys(line.strip() for line in f if line.strip()))
    except OSError:
        return []


def write_set_record(folder: str, command: list[str], links: dict[str, str], stages: dict[str, dict]) -> None:
    """`set.json` of the set being written into `folder` (`publish_set`'s staging folder)."""
    from datamodules.atomic_files import atomic_write_json

    atomic_write_json({"command": command, "links": sorted(links), "published": time.time(), "stages": stages},
                      os.path.join(folder, SET_RECORD))


# ---- owner -------------------------------------------------------------------------------------------------------
def owner_changes(set_dir: str, protocol: dict, defaults: dict[str, Any],
                  nested_defaults: Optional[dict[str, dict[str, Any]]] = None,
                  grows: Optional[dict[str, Optional[str]]] = None) -> list[str]:
    """How `protocol` (a configuration as a dict) differs from the one that made the set in `set_dir` ([] when it is
    the same configuration, or no set is there), as lines a person reads.

    An option added to the code since the set was published is no change at its declared default: `defaults` are
    the configuration's, `nested_defaults[key]` those of the dicts under `key` (a list of methods, a search's
    settings). `grows`: list keys along which a configuration may grow and stay the same one (`{"methods": "name",
    "seeds": None}`): items added are fine, an item dropped or changed (matched by that field, or by value) is a
    change -- the new set would lose rows the old one published."""
    published = read_json(os.path.join(set_dir, "protocol.json"))
    if published is None:
        return []
    ours = {k: v for k, v in _plain(protocol).items() if k not in PROTOCOL_LOCATION_KEYS}
    theirs = {k: v for k, v in published.items() if k not in PROTOCOL_LOCATION_KEYS}
    ours = _without_added_defaults(theirs, ours, defaults)
    lines = []
    for key, field in (grows or {}).items():
        old, new = theirs.pop(key, None) or [], ours.pop(key, None) or []
        lines += _lost_items(key, old, new, field, (nested_defaults or {}).get(key, {}))
    for key, item_defaults in (nested_defaults or {}).items():
        if isinstance(theirs.get(key), dict) and isinstance(ours.get(key), dict):
            ours[key] = _without_added_defaults(theirs[key], ours[key], item_defaults)
    return lines + identity_diff(theirs, ours, limit=6)


def _lost_items(key: str, old: list, new: list, field: Optional[str], item_defaults: dict[str, Any]) -> list[str]:
    """'<key>: drops [...]' / '<key>: changes [...]' for the old list's items that the new one lacks or changed."""
    name = (lambda item: item.get(field)) if field else (lambda item: item)  # noqa: E731
    new_by_name = {json.dumps(name(item), default=str): item for item in new}
    dropped, changed = [], []
    for item in old:
        mine = new_by_name.get(json.dumps(name(item), default=str))
        if mine is None:
            dropped.append(name(item))
        elif field and _without_added_defaults(item, mine, item_defaults) != item:
            changed.append(name(item))
    return ([f"{key}: drops {dropped}"] if dropped else []) + ([f"{key}: changes {changed}"] if changed else [])


def _without_added_defaults(theirs: dict, ours: dict, defaults: dict[str, Any]) -> dict:
    return {k: v for k, v in ours.items() if k in theirs or k not in defaults or _plain(defaults[k]) != v}


def refuse_other_owner(set_dir: str, protocol: dict, defaults: dict[str, Any],
                       nested_defaults: Optional[dict[str, dict[str, Any]]], grows: Optional[dict[str, Optional[str]]],
                       option: str) -> None:
    """Refuse, before any work, to publish over a set another configuration made (`owner_changes`). `option`: the
    flag that gives this configuration a set of its own (e.g. "--results_name"), for the way out."""
    diff = owner_changes(set_dir, protocol, defaults, nested_defaults, grows)
    if not diff:
        return
    record = read_json(os.path.join(set_dir, SET_RECORD)) or {}
    made_by = " ".join(record.get("command") or []) or "(not recorded: a set published before sets named their owner)"
    raise PublishedSetError(
        f"{set_dir} holds the table of another protocol configuration, which this run would replace: "
        + "; ".join(diff) + f". It was made by: {made_by}. Give this configuration its own table with "
        f"{option} NAME (its set goes to <out_dir>/NAME/), or replace that table with --replace_results, or use "
        "another --out_dir.")


# ---- readers -----------------------------------------------------------------------------------------------------
def set_problems(set_dir: str) -> list[str]:
    """Why the set in `set_dir` no longer stands for its stages: a stage result gone, or run again ([] if none)."""
    record = read_json(os.path.join(set_dir, SET_RECORD))
    if record is None:
        return [f"{set_dir} records no stages ({SET_RECORD} is missing: published by an older version)"]
    out_dir = os.path.dirname(os.path.abspath(set_dir))
    problems = []
    for key, entry in sorted(record.get("stages", {}).items()):
        result = read_json(os.path.join(out_dir, entry["result"]))
        if result is None:
            problems.append(f"{key} is gone (no {entry['result']})")
        elif result.get("run") != entry["run"] or digest(result.get("identity") or {}) != entry["identity"]:
            problems.append(f"{key} ran again since the table was published")
    return problems


def find_set(path: str, name: str = "results") -> str:
    """The set folder for `path`: a set folder itself, or an out_dir holding `<name>/`."""
    if os.path.isfile(os.path.join(path, "results.json")) and not os.path.islink(os.path.join(path, "results.json")):
        return path
    return os.path.join(path, name)


def load_published(path: str, name: str = "results", rerun_hint: str = "rerun its protocol") -> dict:
    """The published `results.json` under `path` (an out_dir, or a set folder), after checking that every stage it
    read is still there as it was. Raises `PublishedSetError` naming what is missing, stale or gone."""
    set_dir = find_set(path, name)
    results = read_json(os.path.join(set_dir, "results.json"))
    if results is None:
        stale = read_stale_note(set_dir)
        why = f": it was withdrawn ({stale})" if stale else ""
        raise PublishedSetError(f"{path}: no published table{why} ({set_dir}/results.json is missing); "
                                f"{rerun_hint} to publish one")
    problems = set_problems(set_dir)
    if problems:
        raise PublishedSetError(f"{set_dir} is stale: " + "; ".join(problems[:5])
                                + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
                                + f". Its table no longer stands for its stages: {rerun_hint} to republish it "
                                "(finished stages are reused)")
    return results


def set_state(set_dir: str) -> tuple[str, str]:
    """("published" | "stale" | "missing", detail) of a set, for `--status`."""
    if os.path.isfile(os.path.join(set_dir, "results.json")):
        problems = set_problems(set_dir)
        return ("stale", "; ".join(problems[:3])) if problems else ("published", "")
    note = read_stale_note(set_dir)
    return ("stale", note) if note else ("missing", "")


# ---- withdrawal --------------------------------------------------------------------------------------------------
def read_stale_note(set_dir: str) -> Optional[str]:
    """The first line of a withdrawn set's note (`<set>.stale/STALE.md`), or None."""
    try:
        with open(os.path.join(set_dir + STALE_SUFFIX, STALE_NOTE), encoding="utf-8") as f:
            return f.readline().strip()
    except OSError:
        return None


def withdraw_sets_reading(out_dir: str, stage_key: str, why: str) -> list[str]:
    """Withdraw every published set in `out_dir` that read `stage_key` (the caller is about to rerun it): each moves
    to `<name>.stale/` with a note, and its stable names go. Returns the withdrawn sets' folders."""
    withdrawn = []
    for set_dir in published_sets(out_dir):
        record = read_json(os.path.join(set_dir, SET_RECORD))
        if record is None or stage_key in record.get("stages", {}):  # an older set recorded none: it read them all
            withdraw(set_dir, record, f"withdrawn on {time.strftime('%Y-%m-%d %H:%M:%S')}: {stage_key} {why}")
            withdrawn.append(set_dir)
    return withdrawn


def withdraw_sets_reading_file(result_path: str, stage_key: str, why: str) -> list[str]:
    """Withdraw every published set, in any folder, that recorded `result_path` by its real path (the sets named
    beside it: `register_readers`) and still stands. Returns the withdrawn sets' folders."""
    real = os.path.realpath(result_path)
    withdrawn = []
    for set_dir in _readers(real):
        record = read_json(os.path.join(set_dir, SET_RECORD))
        if record is None or not any(e.get("real") == real for e in record.get("stages", {}).values()):
            continue  # withdrawn or republished since, or no longer reading this stage
        withdraw(set_dir, record, f"withdrawn on {time.strftime('%Y-%m-%d %H:%M:%S')}: {stage_key} "
                                  f"({os.path.dirname(real)}) {why}")
        withdrawn.append(set_dir)
    return withdrawn


def withdraw(set_dir: str, record: Optional[dict], note: str) -> None:
    """Move the set aside as `<set>.stale/` (one rename: readers see the set or nothing) and remove its links."""
    parent = os.path.dirname(set_dir)
    for link in (record or {}).get("links", []):
        path = os.path.join(parent, link)
        if os.path.islink(path):
            os.remove(path)
    stale = set_dir + STALE_SUFFIX
    shutil.rmtree(stale, ignore_errors=True)
    os.rename(set_dir, stale)
    with open(os.path.join(stale, STALE_NOTE), "w", encoding="utf-8") as f:
        f.write(note + "\n\nThe tables in this folder are the last ones published before that; they no longer stand "
                       "for the stages on disk. Rerun the protocol to publish a current set.\n")


def published_sets(out_dir: str) -> list[str]:
    """The set folders in `out_dir`: each holds a `set.json`, or, published by an older version, a `results.json`
    beside its `protocol.json`."""
    try:
        names = sorted(os.listdir(out_dir))
    except FileNotFoundError:
        return []
    is_set = lambda d: os.path.isfile(os.path.join(d, SET_RECORD)) or all(  # noqa: E731
        os.path.isfile(os.path.join(d, f)) for f in ("results.json", "protocol.json"))
    return [os.path.join(out_dir, n) for n in names if not n.startswith(".") and not n.endswith(STALE_SUFFIX)
            and not os.path.islink(os.path.join(out_dir, n)) and is_set(os.path.join(out_dir, n))]


def remove_stale(set_dir: str) -> None:
    """After a fresh publish of the same set: the withdrawn copy has served its purpose."""
    shutil.rmtree(set_dir + STALE_SUFFIX, ignore_errors=True)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
