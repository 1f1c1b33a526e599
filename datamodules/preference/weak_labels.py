"""The weak-label file (docs/w2s.md): where it lives, what it holds, how it is read -- no model in sight.

For each pair of the student half, the order (a, b) is a seeded coin per pair id (so q is not always > 0.5)
and q = σ(r_teacher(x, a) − r_teacher(x, b)). The teacher also scores every test split (a = chosen), so
teacher and student are later compared on exactly the same pairs.
Everything lands in one JSON file, keyed by the teacher checkpoint (its path and the SHA-256 of its files), the
records, the teacher's tokenization and the seed, written atomically: a second run (or every student of a protocol)
reuses it.

The teacher is a `RewardModelModule` checkpoint (.ckpt), an outside reward model, `hf_classifier:<dir or hub id>`
(any `…ForSequenceClassification`, e.g. an export of ours: docs/export.md), or a labelling function,
`labeller:<name>` (`labelling_functions.py`, computed by the data module itself: no model). The data layer never
loads a model: the scoring (`lightning_modules/reward/weak_labeller.py`: `compute_weak_labels`, a `WeakLabeller`) is
handed to the data module from above (`cli.py`), and writes the file with `write_weak_labels`; the data module only
names the file, keys it and reads it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Optional, Protocol

from datamodules.atomic_files import atomic_write_json
from datamodules.classifier_paths import canonical_classifier, classifier_source, is_hf_classifier, looks_like_path
from datamodules.preference.labelling_functions import is_labeller, labeller_key
from datamodules.preference.prepared_index import file_sha256
from datamodules.preference.records import fingerprint

FORMAT_VERSION = 2  # 2: the teacher also scores the validation split (`validation_margins`, the weak_val rule)


def swap_order(record_id: str, seed: int) -> bool:
    """The seeded 50/50 coin deciding whether a = rejected for this pair (independent of dataset order)."""
    digest = hashlib.sha1(f"{seed}:{record_id}".encode("utf-8")).digest()
    return digest[0] % 2 == 1


def checkpoint_key(path: str, flag: str = "--data.teacher_checkpoint") -> str:
    """The teacher's path and the state of its files: path, size and mtime (ns) of the .ckpt file, or of every file of
    a model directory that can change its scores (recursively, except the model card and dotfiles); a hub id by the
    commit its files resolve to.

    Cheap (no file is read), so the W2S protocol keys an outside model's identity with it; it cannot see a copy that
    keeps mtimes (`cp -p`, `rsync -a`) of other weights with the same sizes. The label cache therefore also keys the
    files' contents (`checkpoint_contents`).
    """
    if is_labeller(path):  # a labelling function: its spec and code version (docs/vader_icwsm.md)
        return labeller_key(path)
    if not is_hf_classifier(path):
        st = os.stat(path)
        return f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"
    source = classifier_source(path)
    if not looks_like_path(source):
        return f"hf_classifier:hub:{source}@{hub_commit(source, flag)}"
    root = os.path.abspath(os.path.expanduser(source))
    files = []
    for rel, full in _scoring_files(root):
        st = os.stat(full)
        files.append([rel, st.st_size, st.st_mtime_ns])
    return f"hf_classifier:{root}:" + hashlib.sha1(json.dumps(files).encode("utf-8")).hexdigest()


def checkpoint_contents(path: str) -> str:
    """SHA-256 of the teacher's bytes: the .ckpt file's, or each scoring file's of a model directory (as in
    `checkpoint_key`); "" for a hub id, whose commit already names its contents.

    Read in full on every call (about a second per GB; the data module asks in `prepare_data` and in `setup`), never
    answered from a cache keyed by size and mtime: a teacher rewritten with its old sizes and mtimes would otherwise
    hand its students the old teacher's labels, and their published accuracies would be the old teacher's students'.
    """
    if is_labeller(path):
        return ""  # no bytes of its own: `checkpoint_key` names its code version
    if not is_hf_classifier(path):
        return file_sha256(path)
    source = classifier_source(path)
    if not looks_like_path(source):
        return ""
    root = os.path.abspath(os.path.expanduser(source))
    files = [[rel, file_sha256(full)] for rel, full in _scoring_files(root)]
    return hashlib.sha256(json.dumps(files).encode("utf-8")).hexdigest()


def _scoring_files(root: str) -> list[tuple[str, str]]:
    """(relative path, absolute path) of a model directory's files that can change its scores, in a stable order:
    all but the model card (*.md) and dotfiles."""
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if not (name.startswith(".") or name.endswith(".md")):
                full = os.path.join(folder, name)
                out.append((os.path.relpath(full, root), full))
    return out


def hub_commit(repo_id: str, flag: str) -> str:
    """The commit a hub model's config resolves to (from the local cache when offline)."""
    from huggingface_hub import hf_hub_download

    try:
        config = hf_hub_download(repo_id, "config.json")
    except Exception as err:  # offline and not cached, unknown id, no network: many exception types
        raise ValueError(f"{flag} 'hf_classifier:{repo_id}': no local directory {repo_id!r} and no hub model of that "
                         f"id could be reached: {type(err).__name__}: {str(err)[:200]}") from None
    parts = os.path.normpath(config).split(os.sep)
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts else "unknown"


def weak_label_path(cache_dir: str, teacher_checkpoint: str, student_records: list[dict],
                    test_records: dict[str, list[dict]], seed: int, max_length: int, truncation: str,
                    validation_records: Optional[list[dict]] = None) -> str:
    teacher = [checkpoint_key(teacher_checkpoint), checkpoint_contents(teacher_checkpoint)]
    payload = json.dumps([FORMAT_VERSION, teacher, fingerprint(student_records),
                          {k: fingerprint(v) for k, v in sorted(test_records.items())}, seed, max_length, truncation,
                          fingerprint(validation_records or [])])
    key = hashlib.sha1(payload.encode("utf-8")).hexdigest()[:20]
    return os.path.join(cache_dir, "weak_labels", f"{key}.json")


class WeakLabeller(Protocol):
    """What the data module calls to label its student half (`compute_weak_labels` is one): score the pairs with the
    teacher, write the file at `out_path` (`write_weak_labels`) and return its contents."""

    def __call__(self, teacher_checkpoint: str, student_records: list[dict], test_records: dict[str, list[dict]],
                 seed: int, max_length: int, truncation: str, out_path: str, batch_size: int = 64,
                 validation_records: Optional[list[dict]] = None) -> dict: ...


def write_weak_labels(out_path: str, teacher_checkpoint: str, seed: int, teacher_tokenizer: str,
                      labels: dict[str, list], teacher_margins: dict[str, dict[str, float]],
                      validation_margins: Optional[dict[str, float]] = None) -> dict:
    """Write the weak-label file atomically and return its contents (what `read_weak_labels` reads back).

    Args:
        out_path: the file (`weak_label_path`).
        teacher_checkpoint: the teacher as given; recorded as `teacher_name`.
        seed: the seed of the order coins (`swap_order`).
        teacher_tokenizer: the tokenizer the teacher scored with.
        labels: record id -> [q, swapped] on the student half, q = P(a ≻ b), swapped meaning a = rejected.
        teacher_margins: test split name -> record id -> the teacher's chosen − rejected margin.
        validation_margins: record id -> the teacher's chosen − rejected margin on the source's validation split:
            what the `weak_val` selection rule scores students against (their agreement with the teacher, no gold
            label read). Absent in files made before it (format 1, or a `--data.weak_labels` file without it).
    """
    payload = {
        "meta": {"teacher_checkpoint": teacher_name(teacher_checkpoint), "seed": seed, "pairs": len(labels),
                 "teacher_tokenizer": teacher_tokenizer,
                 "mean_q": sum(q for q, _ in labels.values()) / max(len(labels), 1),
                 "agreement_with_gold": gold_agreement(labels)},
        "labels": labels,
        "teacher_margins": teacher_margins,
    }
    if validation_margins is not None:
        payload["validation_margins"] = validation_margins
    atomic_write_json(payload, out_path, indent=None)  # large: no indentation
    return payload


def teacher_name(teacher_checkpoint: str) -> str:
    """The teacher as recorded in the label file: an absolute path (a directory's, after the prefix) or a hub id."""
    if is_labeller(teacher_checkpoint):
        return teacher_checkpoint
    return canonical_classifier(teacher_checkpoint) if is_hf_classifier(teacher_checkpoint) else os.path.abspath(
        teacher_checkpoint)


def gold_agreement(labels: dict) -> float:
    """Share of pairs whose weak label picks the gold-chosen response (q > 0.5 exactly when a = chosen)."""
    return sum((q > 0.5) != bool(s) for q, s in labels.values()) / max(len(labels), 1)


class UninformativeLabels(ValueError):
    """Weak labels that cannot teach a student anything; the message names the teacher."""


def check_informative(margins: Optional[list[float]], qs: list[float], teacher: str, where: str = "") -> None:
    """Refuse weak labels that carry no information before a student trains on them.

    Args:
        margins: the teacher's margins on the student half (None when only the labels are known: a cached file).
        qs: the labels q = σ(margin), one per pair.
        teacher: the teacher checkpoint (named in the message).
        where: the label file, when the labels were read from one.

    A NaN / inf margin (a diverged or corrupt teacher) turns into a NaN loss or a constant label; every q equal
    (e.g. 0.5 for all pairs: a teacher whose head is zero, or weights overwritten) trains the student on nothing
    while the protocol reports it as a W2S student. Both fail here, not after the student's training.
    """
    source = f" (label file {where})" if where else ""
    values = list(margins) if margins is not None else list(qs)
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad or any(not math.isfinite(q) for q in qs):
        raise UninformativeLabels(
            f"--data.teacher_checkpoint {teacher}: {len(bad) or 'some'} of {len(values)} teacher margins / labels "
            f"are NaN or infinite{source}; a diverged or corrupt teacher? Retrain or pick an earlier checkpoint")
    if len(qs) > 1 and max(qs) - min(qs) <= 1e-7:
        raise UninformativeLabels(
            f"--data.teacher_checkpoint {teacher}: every one of the {len(qs)} weak labels is q = {qs[0]:.6f}{source}: "
            "the teacher scores every response alike, so its labels carry no information (an untrained or "
            "corrupt teacher?)")


def read_weak_labels(path: str, flag: str = "--data.weak_labels") -> dict:
    """A weak-label file (as `write_weak_labels` writes it), refused when its labels carry no information.

    Args:
        path: the JSON label file (a cached one, or one given by `--data.weak_labels`).
        flag: the option that named it, for the messages.
    """
    try:
        with open(path) as f:
            payload = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"{flag} {path!r} is not a readable weak-label file: {type(err).__name__}: {err}") from err
    if not isinstance(payload, dict) or not isinstance(payload.get("labels"), dict):
        raise ValueError(f"{flag} {path!r} holds no 'labels' mapping: not a weak-label file")
    teacher = (payload.get("meta") or {}).get("teacher_checkpoint", "(not recorded)")
    check_informative(None, [float(v[0]) for v in payload["labels"].values()], teacher, path)
    return payload
