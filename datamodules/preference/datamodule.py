"""PreferenceDataModule: a source dataset (teacher half / student half / validation / ID test) and OOD test splits.

Split layout (all seeded and recorded in `<log_dir>/data_manifest.json` and `<log_dir>/splits.json`):
- the source's train split is shuffled and cut into the **teacher half** (first `teacher_fraction`) and the
  **student half** (the rest); `train_subset` picks what `fit` trains on: both (`all`, the default) or one half;
- validation: the source's validation split, or `val_fraction` of train carved off first when it has none;
- test: the source's test split (ID) and the test split of every OOD target, in that order
  (`test_split_names`), each evaluated by `cli.py test` and logged as `test/acc/<source name>`.
Tokenized splits are cached with `datasets` under `cache_dir`, keyed by the records, the tokenizer and the
tokenization settings, and written atomically (a crash never leaves a half-written cache; the temp folders of a
killed run are removed by the next, `atomic_files.remove_orphans`; a failed write names the path and the flag that
chose it). A small index beside them (`prepared_index.py`) lets a run whose local files have unchanged contents (or
whose generator options are unchanged) reload the cache without loading the records again.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import Counter
from typing import Optional

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from datamodules.atomic_files import atomic_write, naming_write_errors, remove_orphans, remove_path, temp_path
from datamodules.cache_dir import resolve_cache_dir
from datamodules.checkpoint_archive import verify_archive
from datamodules.classifier_paths import check_classifier_source, is_hf_classifier
from datamodules.preference.collate import PairCollator
from datamodules.preference.columns import fast_column, value_counts
from datamodules.preference.pair_tokenization import TRUNCATION_POLICIES, PairTokenizer
from datamodules.preference.prepared_index import index_path, read_index, write_index
from datamodules.preference.label_diagnostics import weak_label_diagnostics
from datamodules.preference.records import RECORD_KEYS, fingerprint
from datamodules.preference.samplers import LengthGroupedSampler
from datamodules.preference.tokenized_cache import load_cached_split
from datamodules.preference.sources import DataError, build_source
from datamodules.preference.labeller_labels import compute_labeller_labels
from datamodules.preference.labelling_functions import build_labeller, is_labeller
from datamodules.preference.weak_labels import WeakLabeller, read_weak_labels, weak_label_path
from datamodules.tokenizers import load_tokenizer

TRAIN_SUBSETS = ("teacher", "student", "all")
CACHE_VERSION = "1"


def default_cache_dir() -> str:
    return resolve_cache_dir()[0]


def tempered(q: float, temperature: float) -> float:
    """σ(logit(q) / T) for a stored soft label q = σ(Δ); T = 0 gives the hard label (0.5 on a tie)."""
    if temperature == 1.0:
        return q
    if temperature == 0.0 or q in (0.0, 1.0):
        return 1.0 if q > 0.5 else 0.0 if q < 0.5 else 0.5
    return 1.0 / (1.0 + math.exp(-math.log(q / (1.0 - q)) / temperature))


VALIDATION = ":validation"  # the validation split's key among the teacher's margins (no source name starts with ':')


def _margin_key(kind: str) -> str:
    """The teacher margins a split reads: a test split's by its name, the validation split's (weak_val) by
    `VALIDATION`; the training halves read none."""
    return kind[len("test/"):] if kind.startswith("test/") else VALIDATION if kind == "validation" else ""


class PairDataset(Dataset):
    """Tokenized pairs held as column lists; optional soft labels q and order swaps keyed by record id.

    A swapped pair presents (a, b) = (rejected, chosen); its label q is P(a ≻ b) under the teacher.
    """

    COLUMNS = ("id", "a_input_ids", "a_response_start", "b_input_ids", "b_response_start", "index", "length")

    def __init__(self, hf_dataset, labels: Optional[dict] = None, teacher_margins: Optional[dict] = None,
                 teacher_labels: Optional[list[dict]] = None):
        self.cols = {k: fast_column(hf_dataset, k) for k in self.COLUMNS}
        self.labels, self.teacher_margins = labels, teacher_margins
        # several teachers' labels of the same (a, b) (the order coin is the teacher's no more than the pair's):
        # the main teacher's first, then --data.extra_teacher_checkpoints' in order (multi-teacher objectives)
        self.teacher_labels = teacher_labels

    def __len__(self) -> int:
        return len(self.cols["index"])

    def __getitem__(self, i: int) -> dict:
        ex = {k: self.cols[k][i] for k in self.COLUMNS}
        ex["label"] = 1.0
        if self.teacher_margins is not None:
            ex["teacher_margin"] = self.teacher_margins[ex["id"]]
        if self.teacher_labels is not None:
            ex["teacher_labels"] = [float(labels[ex["id"]][0]) for labels in self.teacher_labels]
        if self.labels is not None:
            q, swap = self.labels[ex["id"]]
            ex["label"] = float(q)
            if swap:
                ex["a_input_ids"], ex["b_input_ids"] = ex["b_input_ids"], ex["a_input_ids"]
                ex["a_response_start"], ex["b_response_start"] = ex["b_response_start"], ex["a_response_start"]
        return ex

    @property
    def lengths(self) -> list[int]:
        return self.cols["length"]


class PreferenceDataModule(pl.LightningDataModule):
    """Preference pairs from one source (ID) and OOD targets, tokenized for a reward model.

    Args:
        source: registry name of the source dataset (e.g. "hh_helpful", "synth_helpful_cooking").
        ood_targets: registry names of the OOD test datasets (zero-shot, never trained on).
        tokenizer: tokenizer name or directory; linked from `--model.tokenizer` by the CLI.
        local_dirs: per source name, a directory of local files in the hub schema (instead of the hub).
        source_options: per source name, constructor options (e.g. the synthetic generator's knobs).
        max_length: maximum tokens per sequence (prompt + response).
        truncation: "keep_response" (cut the prompt's oldest tokens first), "truncate_response" or "drop".
        train_subset: what `fit` trains on: "all" (the whole train split, the default), or one half of it,
            "teacher" or "student" (the weak-to-strong protocol's halves: it names the half of each stage).
        teacher_fraction: share of the source train split that forms the teacher half.
        val_fraction: share of train carved off as validation when the source has no validation split.
        max_pairs: optional caps per split kind ("train", "validation", "test"), a seeded subsample.
        teacher_checkpoint: a teacher reward-model checkpoint, "hf_classifier:<dir or hub id>" (an outside
            `…ForSequenceClassification`, scored with its own head and tokenizer), or "labeller:<name>" (a labelling
            function, computed here without a model: docs/vader_icwsm.md): its soft labels on the student
            half become the training labels (computed once in `prepare_data` by the `weak_labeller` that `cli.py`
            attaches, cached) and its margins on every test split are attached to the test pairs, so teacher and
            student are scored on the same pairs.
        weak_labels: path of a weak-label file (`datamodules.preference.weak_labels.write_weak_labels`'s format),
            instead of computing it.
        extra_teacher_checkpoints: more teachers (checkpoints or "hf_classifier:..." models, as
            `teacher_checkpoint`) whose labels of the student half are computed and cached exactly like the main
            teacher's, on the same (a, b) order. The training batches then carry `teacher_labels` (B, K+1): column 0
            the main teacher's q (the batch's `labels`), then these in order -- what a multi-teacher objective
            (`--model.objective multi_teacher`, docs/multi_teacher.md) trains on. The main teacher stays the
            reference of the transfer scores (WRG / AOG / NTS) and of `val/weak_acc`.
        label_teacher: whose labels are the batch's `labels` (what a single-teacher objective trains on): 0 = the
            main teacher (`--data.teacher_checkpoint` / `--data.weak_labels`), k = the k-th of
            `extra_teacher_checkpoints`. A student of another teacher whose test margins, and so its WRG / AOG /
            NTS, are still the main teacher's.
        label_seed: seed of the per-pair order coin of the weak labels (default: `seed`).
        teacher_source_options: overrides of the source's options for the teacher half only -- the knob for a
            teacher that knows part of the true rule (e.g. {"artifact_rate": 0.6}: the artifact is a weaker cue
            in the teacher's data, so it must learn more of the rule). The student half is unchanged.
        label_temperature: T of the weak labels q = σ(Δ_teacher / T): 1 keeps the teacher's soft labels, < 1
            sharpens them, 0 makes them hard (1 if Δ > 0, 0 if Δ < 0, 0.5 on a tie). Applied when the cached
            labels are loaded, so every temperature reuses one teacher pass.
        train_labels: "weak" trains on the teacher's soft labels; "gold" keeps the gold labels (the ceiling)
            while the teacher's test margins still give teacher-vs-student scores on the same pairs.
        batch_size: pairs per training batch (2x sequences per forward).
        eval_batch_size: pairs per evaluation batch (length-sorted).
        length_grouped: group training batches by length (less padding).
        group_chunk_batches: batches per length-sorted chunk of the grouped sampler.
        seed: seed of the halves, carving, subsampling and batch order.
        cache_dir: where tokenized splits are cached (default $SHIFTGEN_CACHE or ~/.cache/shiftgen).
        num_workers: DataLoader workers.
        num_proc: processes of the tokenizing `datasets.map` (1 = in this process); the cached data are the same.
    """

    def __init__(
        self,
        source: str,
        ood_targets: list[str] = [],
        tokenizer: Optional[str] = None,
        local_dirs: dict[str, str] = {},
        source_options: dict[str, dict] = {},
        max_length: int = 512,
        truncation: str = "keep_response",
        train_subset: str = "all",
        teacher_fraction: float = 0.5,
        val_fraction: float = 0.05,
        max_pairs: dict[str, int] = {},
        teacher_checkpoint: Optional[str] = None,
        weak_labels: Optional[str] = None,
        extra_teacher_checkpoints: list[str] = [],
        label_teacher: int = 0,
        label_seed: Optional[int] = None,
        label_temperature: float = 1.0,
        train_labels: str = "weak",
        teacher_source_options: dict = {},
        batch_size: int = 16,
        eval_batch_size: int = 64,
        length_grouped: bool = True,
        group_chunk_batches: int = 50,
        seed: int = 0,
        cache_dir: Optional[str] = None,
        num_workers: int = 0,
        num_proc: int = 1,
    ):
        super().__init__()
        self.save_hyperparameters()
        _validate(source, ood_targets, truncation, train_subset, teacher_fraction, val_fraction, max_pairs,
                  batch_size, eval_batch_size, local_dirs, source_options)
        _check_source_options(source, ood_targets, local_dirs, source_options, teacher_source_options)
        if (teacher_checkpoint or weak_labels) and train_subset != "student":
            raise ValueError("--data.teacher_checkpoint / --data.weak_labels label the student half: "
                             f"set --data.train_subset student (got {train_subset!r})")
        if isinstance(label_temperature, bool) or not label_temperature >= 0:
            raise ValueError(f"--data.label_temperature must be >= 0 (0 = hard labels), got {label_temperature!r}")
        if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
            raise ValueError(f"--data.num_proc must be an integer >= 1, got {num_proc!r}")
        if train_labels not in ("weak", "gold"):
            raise ValueError(f"--data.train_labels must be 'weak' or 'gold', got {train_labels!r}")
        if teacher_checkpoint and weak_labels:
            raise ValueError("give either --data.teacher_checkpoint or --data.weak_labels, not both")
        if teacher_checkpoint:
            check_teacher(teacher_checkpoint, "--data.teacher_checkpoint")
        _check_extra_teachers(list(extra_teacher_checkpoints), label_teacher, teacher_checkpoint, weak_labels,
                              train_labels)
        self.source, self.ood_targets = source, list(ood_targets)
        self.tokenizer_name = tokenizer
        self.cache_dir, self.cache_dir_origin = resolve_cache_dir(cache_dir)  # the origin is named by write errors
        self.datasets: dict[str, PairDataset] = {}
        self.manifest: dict = {}
        self._tokenizer = None
        self._loaded: Optional[tuple[dict, dict]] = None  # records and report, from prepare_data to setup
        self._index_key: Optional[str] = None  # the prepared index's path (`_index_path`), once computed
        self._index_key_known = False
        # What labels the student half with the teacher when its labels are not cached: the data layer loads no
        # model, so it is handed one from above (`lightning_modules.reward.weak_labeller.attach_weak_labeller`).
        self.weak_labeller: Optional[WeakLabeller] = None

    # ---- public names ------------------------------------------------------------------------------------
    @property
    def test_split_names(self) -> list[str]:
        return [self.source] + self.ood_targets

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if self.tokenizer_name is None:
                raise ValueError("--data.tokenizer is not set (the CLI links it from --model.tokenizer)")
            self._tokenizer = load_tokenizer(self.tokenizer_name)
        return self._tokenizer

    # ---- records ------------------------------------------------------------------------------------------
    def load_records(self) -> tuple[dict[str, list[dict]], dict]:
        """Records per split kind: train_teacher, train_student, validation, and one test list per source."""
        hp = self.hparams
        src = build_source(self.source, hp.local_dirs.get(self.source), **hp.source_options.get(self.source, {}))
        report: dict = {"dropped": {}, "origin": {}}

        def load(source_obj, split):
            part = source_obj.load(split)
            report["dropped"][f"{source_obj.name}/{split}"] = dict(part.dropped)
            report["origin"][f"{source_obj.name}/{split}"] = part.origin
            return part.records

        rng = random.Random(hp.seed)
        train, validation = self._shuffled_train(load(src, "train"), src)
        if "validation" in src.available_splits():
            validation = load(src, "validation")
        n_teacher = int(round(hp.teacher_fraction * len(train)))
        teacher_half = train[:n_teacher]
        if hp.teacher_source_options:
            # The teacher half from a variant of the source (e.g. a weaker artifact correlation): the same
            # seeded shuffle and cut, so its pairs stand where the default source's teacher half would.
            variant = build_source(self.source, hp.local_dirs.get(self.source),
                                   **{**hp.source_options.get(self.source, {}), **hp.teacher_source_options})
            variant_train, _ = self._shuffled_train(variant.load("train").records, variant)
            if len(variant_train) != len(train):
                raise DataError(f"--data.teacher_source_options changes the size of {self.source}'s train split "
                                f"({len(variant_train)} vs {len(train)} pairs): it may change artifacts, not sizes")
            teacher_half = variant_train[:n_teacher]
        records = {
            "train_teacher": teacher_half,
            "train_student": train[n_teacher:],
            "validation": self._cap(validation, "validation", rng),
        }
        for name in self.test_split_names:
            s = src if name == self.source else build_source(name, hp.local_dirs.get(name),
                                                             **hp.source_options.get(name, {}))
            records[f"test/{name}"] = self._cap(load(s, "test"), "test", random.Random(hp.seed))
        for kind, recs in records.items():
            if not recs:
                raise DataError(f"split {kind!r} of --data.source {self.source} is empty (after filtering and "
                                f"--data.max_pairs / --data.teacher_fraction)")
        return records, report

    def _shuffled_train(self, train: list[dict], src) -> tuple[list[dict], list[dict]]:
        """Seeded shuffle; a carved validation split when the source has none; the train cap."""
        train = list(train)
        random.Random(self.hparams.seed).shuffle(train)
        validation: list[dict] = []
        if "validation" not in src.available_splits():
            n_val = max(1, int(round(self.hparams.val_fraction * len(train))))
            validation, train = train[:n_val], train[n_val:]
        return self._cap(train, "train"), validation

    def _cap(self, records: list[dict], kind: str, rng: Optional[random.Random] = None) -> list[dict]:
        cap = self.hparams.max_pairs.get(kind)
        if cap is None or len(records) <= cap:
            return records
        if rng is not None:
            records = list(records)
            rng.shuffle(records)
        return records[:cap]

    # ---- tokenization + cache ----------------------------------------------------------------------------
    def _tokenizer_key(self) -> str:
        tok = self.tokenizer
        payload = json.dumps([sorted(tok.get_vocab().items()), getattr(tok, "chat_template", None),
                              tok.padding_side, self.hparams.max_length, self.hparams.truncation, CACHE_VERSION])
        return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:12]

    def _tokenized_path(self, kind: str, records_fingerprint: str, tok_key: str) -> str:
        return os.path.join(self.cache_dir, "tokenized", f"{kind.replace('/', '__')}-{records_fingerprint}-{tok_key}")

    def _tokenized(self, kind: str, records: list[dict], tok_key: str):
        import datasets

        path = self._tokenized_path(kind, fingerprint(records), tok_key)
        cached = load_cached_split(path)  # a damaged one is removed, named, and rebuilt below
        if cached is not None:
            return cached, True
        # The raw columns on disk (and the map's output beside them), removed below; owner-named, so that the next
        # run removes them when a SIGKILL skips the `finally`.
        raw_dir = temp_path(f"{path}.raw")
        try:
            with naming_write_errors(raw_dir, self.cache_dir_origin):
                remove_orphans(os.path.dirname(path))
                ds = _raw_columns_on_disk(records, raw_dir)
                num_proc = min(self.hparams.num_proc, len(ds)) if self.hparams.num_proc > 1 else None  # contiguous
                ds = ds.map(TokenizeWithLength(PairTokenizer(self.tokenizer, self.hparams.max_length,
                                                             self.hparams.truncation)),
                            batched=True, batch_size=512, remove_columns=["prompt", "chosen", "rejected"],
                            load_from_cache_file=False, num_proc=num_proc, desc=f"tokenizing {kind}")
                if kind.startswith("test/") or kind == "validation":
                    ds = ds.sort("length", reverse=True)  # length-sorted evaluation batches: little padding
            atomic_save_dataset(ds, path, self.cache_dir_origin)
        finally:
            remove_path(raw_dir)
        return datasets.load_from_disk(path), False

    def prepare_data(self) -> None:
        # Lightning runs this on one process per node: weak labels and tokenization happen once under DDP.
        for sub in ("tokenized", "prepared"):  # a killed run's temps, also when nothing is left to write
            remove_orphans(os.path.join(self.cache_dir, sub))
        if self._prepared_index() is not None:
            return  # every needed split is cached for these inputs
        records, report = self._records()
        key = self._tokenizer_key()
        for kind in self._needed_kinds():
            self._tokenized(kind, records[kind], key)
        if self.hparams.teacher_checkpoint:
            self._weak_labels_file(records)
        for i, extra in enumerate(self.hparams.extra_teacher_checkpoints):
            self._weak_labels_file(records, teacher=extra, flag=extra_flag(i))
        self._remember(records, report)

    def _records(self) -> tuple[dict[str, list[dict]], dict]:
        """`load_records()`, once per data module (prepare_data and setup in one process share it)."""
        if self._loaded is None:
            self._loaded = self.load_records()
        return self._loaded

    # ---- the prepared index: a warm cache without loading the records --------------------------------------
    def _index_path(self) -> Optional[str]:
        """The index's path, from the source files' contents as this data module first saw them: computed before the
        records are loaded, so a file rewritten while they load leaves an index under its *old* contents, which the
        new contents never hit; and once (hashing the files again in `setup` would only cost time)."""
        if not self._index_key_known:
            self._index_key, self._index_key_known = self._compute_index_path(), True
        return self._index_key

    def _compute_index_path(self) -> Optional[str]:
        hp = self.hparams
        if hp.teacher_checkpoint or hp.weak_labels:
            return None  # weak labels are keyed by the records themselves
        settings = {k: hp[k] for k in ("source", "ood_targets", "source_options", "teacher_source_options", "seed",
                                       "teacher_fraction", "val_fraction", "max_pairs")}
        return index_path(self.cache_dir, self.test_split_names, dict(hp.local_dirs), settings)

    def _prepared_index(self) -> Optional[dict]:
        """The index of these inputs when every split this run needs is in the cache, else None."""
        index = read_index(self._index_path())
        if index is None:
            return None
        key = self._tokenizer_key()
        fps = index["fingerprints"]
        if not all(k in fps and load_cached_split(self._tokenized_path(k, fps[k], key)) is not None
                   for k in self._needed_kinds()):  # a damaged split is removed here: `setup` then rebuilds it
            return None
        return index

    def _remember(self, records: dict, report: dict) -> None:
        split_ids = {k: [r["id"] for r in records[k]] for k in ("train_teacher", "train_student")}
        write_index(self._index_path(), {k: fingerprint(v) for k, v in records.items()},
                    {k: len(v) for k, v in records.items()}, {**report, "split_ids": split_ids},
                    chosen_by=self.cache_dir_origin)

    def _weak_labels_file(self, records: dict, teacher: Optional[str] = None,
                          flag: str = "--data.teacher_checkpoint") -> str:
        """The label file of `teacher` (default: the main one), computed by the `weak_labeller` when it is not
        cached. Every teacher's file is keyed and made alike (`weak_label_path`), so a teacher labels a student
        half once, whether it is the main teacher of one student or an extra teacher of another."""
        hp = self.hparams
        teacher = teacher or hp.teacher_checkpoint
        tests = {n: records[f"test/{n}"] for n in self.test_split_names}
        seed = hp.seed if hp.label_seed is None else hp.label_seed
        path = weak_label_path(self.cache_dir, teacher, records["train_student"], tests, seed,
                               hp.max_length, hp.truncation, records["validation"])
        if not os.path.isfile(path) and is_labeller(teacher):  # a labelling function: no model, computed here
            rank_zero_info(f"[data] labelling {len(records['train_student'])} student-half pairs with {teacher}")
            compute_labeller_labels(teacher, records["train_student"], tests, seed, path, records["validation"],
                                    self._build_source)
        if not os.path.isfile(path):
            if self.weak_labeller is None:
                raise RuntimeError(
                    f"{flag} {teacher}: its weak labels are not cached ({path}) and "
                    "this data module has no weak_labeller to compute them (the data layer loads no model). "
                    "`python cli.py fit` attaches one; a data module built in code needs "
                    "`lightning_modules.reward.weak_labeller.attach_weak_labeller(dm)` before `prepare_data`, or "
                    "a label file given as --data.weak_labels instead")
            rank_zero_info(f"[data] labelling {len(records['train_student'])} student-half pairs with the teacher "
                           f"{teacher}")
            self.weak_labeller(teacher, records["train_student"], tests, seed, hp.max_length,
                               hp.truncation, path, batch_size=hp.eval_batch_size,
                               validation_records=records["validation"])
        return path

    def _build_source(self, name: str):
        """A source of this run with its options (what a labelling function reads human ratings from)."""
        hp = self.hparams
        return build_source(name, hp.local_dirs.get(name), **hp.source_options.get(name, {}))

    def _needed_kinds(self) -> list[str]:
        subset = self.hparams.train_subset
        train = ["train_teacher", "train_student"] if subset == "all" else [f"train_{subset}"]
        return train + ["validation"] + [f"test/{n}" for n in self.test_split_names]

    def setup(self, stage: Optional[str] = None) -> None:
        if self.datasets:
            return
        index = self._prepared_index()
        if index is not None:
            self._setup_from_index(index)
            self._loaded = None  # records loaded by prepare_data in this process: the columns hold what training needs
            return
        records, report = self._records()
        key = self._tokenizer_key()
        status: dict[str, dict] = {}
        weak = self._load_weak_labels(records)
        extras = self._load_extra_labels(records, weak) if weak else []
        labels = weak["labels"] if weak and self.hparams.train_labels == "weak" else None
        if labels is not None and self.hparams.label_teacher > 0:  # another teacher's labels, the main one's margins
            labels = extras[self.hparams.label_teacher - 1]["labels"]
        teacher_labels = [weak["labels"], *(e["labels"] for e in extras)] if labels is not None and extras else None
        margins = dict(weak.get("teacher_margins", {})) if weak else {}
        if weak and "validation_margins" in weak:  # the weak_val rule's reference (the teacher's, never gold)
            margins[VALIDATION] = weak["validation_margins"]
        for kind in self._needed_kinds():
            ds, cached = self._tokenized(kind, records[kind], key)
            counts = Counter(value_counts(ds, "status"))
            status[kind] = dict(counts)
            ds = ds.filter(lambda s: s != "dropped_too_long", input_columns="status") if counts["dropped_too_long"] else ds
            if len(ds) == 0:
                raise DataError(f"split {kind!r} is empty after --data.truncation {self.hparams.truncation}")
            use_labels = labels if kind.startswith("train_") else None
            if use_labels is not None:
                missing = [i for i in ds["id"] if i not in weak["labels"]]
                if missing:
                    raise DataError(f"--data.weak_labels {self.hparams.weak_labels} has no label for {len(missing)} "
                                    f"training pairs (e.g. {missing[0]!r}): made for another split or seed?")
                for extra in extras:
                    _refuse_missing_labels(ds["id"], extra)
            self.datasets[kind] = PairDataset(ds, use_labels, margins.get(_margin_key(kind)),
                                              teacher_labels if kind.startswith("train_") else None)
            status[kind]["cached"] = cached
        self.manifest = {
            "source": self.source, "ood_targets": self.ood_targets, "seed": self.hparams.seed,
            "sizes": {k: len(v) for k, v in records.items()}, "tokenization": status, **report,
        }
        if weak:
            self.manifest["teacher_labels"] = self._teacher_label_diagnostics(records["train_student"], weak)
        if extras:  # the main teacher's diagnostics stay `teacher_labels`: it is the reference teacher
            self.manifest["label_teacher"] = self.hparams.label_teacher
            self.manifest["extra_teacher_labels"] = [
                {"teacher": e["teacher"], **self._teacher_label_diagnostics(records["train_student"], e)}
                for e in extras]
        self._split_ids = {k: [r["id"] for r in records[k]] for k in ("train_teacher", "train_student")}
        self._write_manifest()
        self._remember(records, report)
        self._loaded = None  # the columns hold what training needs

    def _setup_from_index(self, index: dict) -> None:
        """`setup` from a warm cache: the same datasets and manifest, without loading the records."""
        import datasets

        key = self._tokenizer_key()
        status: dict[str, dict] = {}
        for kind in self._needed_kinds():
            ds = datasets.load_from_disk(self._tokenized_path(kind, index["fingerprints"][kind], key))
            counts = Counter(value_counts(ds, "status"))
            status[kind] = dict(counts)
            ds = ds.filter(lambda s: s != "dropped_too_long", input_columns="status") if counts["dropped_too_long"] else ds
            if len(ds) == 0:
                raise DataError(f"split {kind!r} is empty after --data.truncation {self.hparams.truncation}")
            self.datasets[kind] = PairDataset(ds)
            status[kind]["cached"] = True
        report = dict(index["report"])
        self._split_ids = report.pop("split_ids")
        self.manifest = {"source": self.source, "ood_targets": self.ood_targets, "seed": self.hparams.seed,
                         "sizes": index["sizes"], "tokenization": status, **report}
        self._write_manifest()

    def _teacher_label_diagnostics(self, student_records: list[dict], weak: dict) -> dict:
        """The teacher's error structure on the student half, from its untempered labels (label_diagnostics)."""
        hp = self.hparams
        src = build_source(self.source, hp.local_dirs.get(self.source), **hp.source_options.get(self.source, {}))
        return weak_label_diagnostics(student_records, weak["raw_labels"], getattr(src, "artifact_side", None))

    def _write_manifest(self) -> None:
        trainer = self.trainer
        log_dir = trainer.log_dir if trainer is not None else None
        rank_zero_info(data_summary(self.manifest, self.hparams.train_subset))
        if trainer is None or not trainer.is_global_zero or not log_dir:
            return
        origin = "the trainer's log_dir (--trainer.default_root_dir / --trainer.logger)"
        atomic_write(os.path.join(log_dir, "data_manifest.json"), json.dumps(self.manifest, indent=2), origin)
        atomic_write(os.path.join(log_dir, "splits.json"), json.dumps(self._split_ids), origin)

    def _load_weak_labels(self, records: dict) -> Optional[dict]:
        hp = self.hparams
        if hp.teacher_checkpoint:  # computed here when setup runs without prepare_data (a bare Trainer call order)
            path = self._weak_labels_file(records)
        elif hp.weak_labels:
            path = hp.weak_labels
            if not os.path.isfile(path):
                raise DataError(f"--data.weak_labels {path!r} does not exist")
        else:
            return None
        # refused when the labels carry no information (non-finite, or all equal), naming the teacher
        flag = "--data.teacher_checkpoint (its cached labels)" if hp.teacher_checkpoint else "--data.weak_labels"
        payload = self._tempered(read_weak_labels(path, flag))
        self.weak_labels_path = path
        return payload

    def _tempered(self, payload: dict) -> dict:
        """A label file's labels under `--data.label_temperature` (`labels`), beside the teacher's own
        (`raw_labels`, what the label diagnostics read)."""
        T = float(self.hparams.label_temperature)
        payload["raw_labels"] = {k: (float(v[0]), bool(v[1])) for k, v in payload["labels"].items()}
        payload["labels"] = {k: (tempered(float(v[0]), T), bool(v[1])) for k, v in payload["labels"].items()}
        return payload

    def _load_extra_labels(self, records: dict, weak: dict) -> list[dict]:
        """Each extra teacher's label file (`--data.extra_teacher_checkpoints`), read and tempered as the main
        teacher's; refused, naming the flag and the file, when its pairs are not the main file's in the same order."""
        hp = self.hparams
        out = []
        for i, teacher in enumerate(hp.extra_teacher_checkpoints):
            flag = extra_flag(i)
            path = self._weak_labels_file(records, teacher=teacher, flag=flag)  # cached by prepare_data: only named
            payload = self._tempered(read_weak_labels(path, f"{flag} {teacher} (its cached labels)"))
            swapped = [k for k, v in payload["labels"].items() if k in weak["labels"]
                       and bool(v[1]) != weak["labels"][k][1]]
            if swapped:
                raise DataError(f"{flag} {teacher}: its label file {path} orders {len(swapped)} pairs otherwise than "
                                f"the main teacher's (e.g. {swapped[0]!r}): made with another --data.seed / "
                                "--data.label_seed? Every teacher must label the same (a, b)")
            out.append({"teacher": teacher, "flag": flag, "path": path, "raw_labels": payload["raw_labels"],
                        "labels": payload["labels"]})
        self.extra_weak_labels_paths = [e["path"] for e in out]
        return out

    # ---- loaders ------------------------------------------------------------------------------------------
    def _collator(self) -> PairCollator:
        return PairCollator(self.tokenizer.pad_token_id, self.tokenizer.padding_side)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        ds = self._train_set()
        if hp.length_grouped:
            world = self.trainer.world_size if self.trainer is not None else 1
            sampler = LengthGroupedSampler(ds.lengths, hp.batch_size * world, hp.group_chunk_batches, hp.seed)
            return DataLoader(ds, batch_size=hp.batch_size, sampler=sampler, collate_fn=self._collator(),
                              num_workers=hp.num_workers)
        return DataLoader(ds, batch_size=hp.batch_size, shuffle=True, collate_fn=self._collator(),
                          num_workers=hp.num_workers)

    def _train_set(self) -> PairDataset:
        subset = self.hparams.train_subset
        if subset != "all":
            return self.datasets[f"train_{subset}"]
        return _ConcatPairs(self.datasets["train_teacher"], self.datasets["train_student"])

    def _eval_loader(self, ds: Dataset) -> DataLoader:
        return DataLoader(ds, batch_size=self.hparams.eval_batch_size, shuffle=False, collate_fn=self._collator(),
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.datasets["validation"])

    def test_dataloader(self) -> list[DataLoader]:
        return [self._eval_loader(self.datasets[f"test/{n}"]) for n in self.test_split_names]


def data_summary(manifest: dict, train_subset: str) -> str:
    """One line: the pairs `fit` trains on (and which part of the train split they are), the other splits' sizes,
    then drops and truncations where there are any, e.g.
    `[data] train 95 pairs (the whole train split: --data.train_subset all); validation 5; test local:d 50`."""
    sizes = manifest["sizes"]
    halves = sizes.get("train_teacher", 0), sizes.get("train_student", 0)
    if train_subset == "all":
        train = f"train {sum(halves)} pairs (the whole train split: --data.train_subset all)"
    else:
        n, other = (halves[0], halves[1]) if train_subset == "teacher" else (halves[1], halves[0])
        train = (f"train {n} pairs (the {train_subset} half of {sum(halves)}: --data.train_subset {train_subset}; "
                 f"the other half's {other} unused)")
    parts = [train] + [f"{'validation' if k == 'validation' else k.replace('test/', 'test ', 1)} {v}"
                       for k, v in sizes.items() if not k.startswith("train_")]
    dropped = {split: counts for split, counts in manifest.get("dropped", {}).items() if counts}
    if dropped:
        parts.append(f"dropped {dropped}")
    cut = {k: {s: c for s, c in v.items() if s not in ("ok", "cached") and c} for k, v in manifest["tokenization"].items()}
    cut = {k: v for k, v in cut.items() if v}
    if cut:
        parts.append(f"truncation {cut}")
    return "[data] " + "; ".join(parts)


class TokenizeWithLength:
    """`PairTokenizer` plus each pair's longer sequence length (the samplers' key), in one `datasets.map` pass."""

    def __init__(self, tokenize: PairTokenizer):
        self.tokenize = tokenize

    def __call__(self, batch: dict) -> dict:
        out = self.tokenize(batch)
        out["length"] = [max(len(a), len(b)) for a, b in zip(out["a_input_ids"], out["b_input_ids"])]
        return out


def _raw_columns_on_disk(records: list[dict], directory: str, chunk: int = 20_000):
    """The records' columns as a memory-mapped dataset, converted to Arrow `chunk` records at a time.

    On disk, the tokenizing map's workers read it by path (an in-memory table is pickled to each of them) and the
    map writes its output to files beside it, not to memory; in chunks, no whole-split Arrow copy sits beside the
    records. Preparing 300k UltraFeedback pairs peaks at 1.7 GB instead of 2.2 GB (benchmarks/bench_data_prep.py).
    """
    import datasets

    def table(start: int, rows: list[dict], features=None):
        columns = {k: [r[k] for r in rows] for k in RECORD_KEYS}
        return datasets.Dataset.from_dict({**columns, "index": list(range(start, start + len(rows)))}, features=features)

    if not records:
        return table(0, [])  # nothing to map (and `datasets` cannot save an empty dataset)
    parts, features = [], None
    for n, start in enumerate(range(0, len(records), chunk)):
        part = table(start, records[start:start + chunk], features)
        features = part.features  # every chunk in the first one's types
        part_dir = os.path.join(directory, f"part{n:05d}")
        with naming_write_errors(part_dir):  # the caller adds the flag that chose `directory`
            part.save_to_disk(part_dir)
        parts.append(datasets.load_from_disk(part_dir))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def atomic_save_dataset(ds, path: str, chosen_by: Optional[str] = None) -> None:
    """Write to a temporary sibling, then rename: readers see a complete cache or none, never half of one.

    Args:
        ds: the dataset to save.
        path: the final folder.
        chosen_by: the flag or variable that chose the cache directory, named when the write fails (a full disk).
    """
    tmp = temp_path(path)
    remove_orphans(os.path.dirname(path))
    try:
        with naming_write_errors(path, chosen_by):  # the final name: the temp's is an implementation detail
            ds.save_to_disk(tmp)
            os.replace(tmp, path)
    except BaseException:
        remove_path(tmp)
        if not os.path.isdir(path):  # another process may have won the race: its cache is complete
            raise


class _ConcatPairs(Dataset):
    """Both halves (train_subset "all"); indices of the second half are shifted to stay unique."""

    def __init__(self, first: PairDataset, second: PairDataset):
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    def __getitem__(self, i: int) -> dict:
        if i < len(self.first):
            return self.first[i]
        ex = self.second[i - len(self.first)]
        ex["index"] += len(self.first)
        return ex

    @property
    def lengths(self) -> list[int]:
        return list(self.first.lengths) + list(self.second.lengths)


def _validate(source, ood_targets, truncation, train_subset, teacher_fraction, val_fraction, max_pairs,
              batch_size, eval_batch_size, local_dirs, source_options) -> None:
    if source in ood_targets:
        raise ValueError(f"--data.ood_targets contains the source {source!r}: OOD targets must differ from it")
    if len(set(ood_targets)) != len(ood_targets):
        raise ValueError(f"--data.ood_targets has duplicates: {ood_targets}")
    if truncation not in TRUNCATION_POLICIES:
        raise ValueError(f"--data.truncation must be one of {TRUNCATION_POLICIES}, got {truncation!r}")
    if train_subset not in TRAIN_SUBSETS:
        raise ValueError(f"--data.train_subset must be one of {TRAIN_SUBSETS}, got {train_subset!r}")
    if not 0.0 < teacher_fraction < 1.0:
        raise ValueError(f"--data.teacher_fraction must be in (0, 1), got {teacher_fraction}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--data.val_fraction must be in (0, 1), got {val_fraction}")
    bad = set(max_pairs) - {"train", "validation", "test"}
    if bad or any(v < 1 for v in max_pairs.values()):
        raise ValueError(f"--data.max_pairs takes positive caps for train/validation/test, got {max_pairs}")
    if batch_size < 1 or eval_batch_size < 1:
        raise ValueError("--data.batch_size and --data.eval_batch_size must be >= 1")
    from datamodules.preference.sources import is_known_source, known_sources_hint

    for flag, name in [("--data.source", source)] + [("--data.ood_targets", t) for t in ood_targets]:
        if not is_known_source(name):
            raise DataError(f"{flag}: unknown preference source {name!r}; {known_sources_hint()}")
    known = {source, *ood_targets}
    for flag, mapping in (("--data.local_dirs", local_dirs), ("--data.source_options", source_options)):
        extra = set(mapping) - known
        if extra:
            raise ValueError(f"{flag} names {sorted(extra)}, which are neither --data.source nor --data.ood_targets")


def _check_source_options(source: str, ood_targets: list[str], local_dirs: dict, source_options: dict,
                          teacher_source_options: dict) -> None:
    """Options a source does not take fail here, naming the flag and the source -- not as a TypeError of the
    source's constructor when records load, minutes later (a generator option such as `artifact_rate` on a hub or
    local-file source, which has none)."""
    from datamodules.preference.sources import build_source

    checks = [("--data.source_options", name, source_options.get(name, {})) for name in [source, *ood_targets]]
    if teacher_source_options:
        checks.append(("--data.teacher_source_options", source,
                       {**source_options.get(source, {}), **teacher_source_options}))
    for flag, name, options in checks:
        if not options:
            continue
        try:
            build_source(name, local_dirs.get(name), **options)  # constructors only store and check: no data read
        except TypeError as err:
            raise ValueError(f"{flag}: source {name!r} takes no option(s) {sorted(options)} (it is read as it is "
                             f"from its files or the hub; generator options apply to the synthetic sources): "
                             f"{err}") from None
        except (ValueError, DataError) as err:
            raise ValueError(f"{flag} for source {name!r}: {err}") from None


def extra_flag(i: int) -> str:
    return f"--data.extra_teacher_checkpoints[{i}]"


def check_teacher(path: str, flag: str) -> None:
    """A teacher given by `flag`: an intact checkpoint file, or an outside classifier that can be found."""
    if is_labeller(path):  # a labelling function (docs/vader_icwsm.md): its name and options
        build_labeller(path, flag)
    elif is_hf_classifier(path):  # an outside reward model (docs/export.md)
        check_classifier_source(path, flag)
    else:
        check_checkpoint_file(path, flag)


def _check_extra_teachers(extras: list[str], label_teacher: int, teacher_checkpoint: Optional[str],
                          weak_labels: Optional[str], train_labels: str) -> None:
    if isinstance(label_teacher, bool) or not isinstance(label_teacher, int) or not 0 <= label_teacher <= len(extras):
        raise ValueError(f"--data.label_teacher must be an integer in [0, {len(extras)}] (0 = the main teacher, k = "
                         f"the k-th of --data.extra_teacher_checkpoints, which has {len(extras)}), got "
                         f"{label_teacher!r}")
    if not extras:
        return
    if not (teacher_checkpoint or weak_labels):
        raise ValueError("--data.extra_teacher_checkpoints needs a main teacher (--data.teacher_checkpoint or "
                         "--data.weak_labels): its labels are column 0 and its margins the reference of the "
                         "transfer scores")
    if train_labels != "weak":
        raise ValueError(f"--data.extra_teacher_checkpoints label the student half for training, but "
                         f"--data.train_labels is {train_labels!r}: drop them, or train on weak labels")
    for i, path in enumerate(extras):
        check_teacher(path, extra_flag(i))
    named = [teacher_checkpoint, *extras] if teacher_checkpoint else extras
    repeated = sorted({p for p in named if named.count(p) > 1})
    if repeated:
        raise ValueError(f"--data.extra_teacher_checkpoints names the teacher(s) {repeated} twice (the main "
                         "--data.teacher_checkpoint counts): each teacher once")


def _refuse_missing_labels(ids: list[str], extra: dict) -> None:
    missing = [i for i in ids if i not in extra["labels"]]
    if missing:
        raise DataError(f"{extra['flag']} {extra['teacher']}: its label file {extra['path']} has no label for "
                        f"{len(missing)} training pairs (e.g. {missing[0]!r}): made for another split or seed?")


def check_checkpoint_file(path: str, flag: str) -> None:
    """Fail early, naming the flag, unless `path` is an intact torch checkpoint (a zip archive holding a pickle): a
    log file or a folder given by mistake would otherwise fail minutes later with a raw UnpicklingError, and bytes
    overwritten in place would load as other weights without a word (every member's CRC-32 is checked:
    `datamodules.checkpoint_archive.verify_archive`, ~0.04 s per 100 MB)."""
    import zipfile

    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r} does not exist")
    try:
        with zipfile.ZipFile(path) as archive:
            is_checkpoint = any(n.endswith("data.pkl") for n in archive.namelist())
    except zipfile.BadZipFile:
        is_checkpoint = False
    if not is_checkpoint:
        raise ValueError(f"{flag} {path!r} is not a torch checkpoint (a .ckpt written by Lightning's "
                         "trainer.save_checkpoint)")
    verify_archive(path, flag)
