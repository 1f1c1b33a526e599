"""The teacher's weak labels: load the teacher, score the student half and every test split, write the label file.

The data layer loads no model (STYLE.md): `PreferenceDataModule` names, keys and reads the weak-label file
(`datamodules/preference/weak_labels.py`) and, when it is not cached yet, calls the `WeakLabeller` it was handed --
`compute_weak_labels` below, attached by `cli.py` (`attach_weak_labeller`) or by whoever builds the data module.
It runs in the data module's `prepare_data` (once per node under DDP; the other ranks wait, then read the file).

The teacher is a `RewardModelModule` checkpoint (.ckpt) or an outside reward model, `hf_classifier:<dir or hub id>`
(any `…ForSequenceClassification`, e.g. an export of ours: docs/export.md), scored whole with its own head and its
own tokenizer, built exactly as `cli.py test --model.backbone hf_classifier:<dir>` builds it.
"""
from __future__ import annotations

import pickle
from typing import Optional

import torch

from datamodules.classifier_paths import check_classifier_source, is_hf_classifier
from datamodules.preference.collate import PairCollator
from datamodules.preference.pair_tokenization import PairTokenizer
from datamodules.preference.weak_labels import check_informative, swap_order, teacher_name, write_weak_labels


@torch.inference_mode()
def score_pairs(model, tokenizer, records: list[dict], swaps: list[bool], max_length: int, truncation: str,
                batch_size: int = 64) -> list[float]:
    """Teacher margins r(a) − r(b) for each record, where (a, b) = (rejected, chosen) when swapped."""
    tokenize = PairTokenizer(tokenizer, max_length, truncation)
    collate = PairCollator(tokenizer.pad_token_id, tokenizer.padding_side)
    margins: list[float] = [0.0] * len(records)
    # Length-sorted batches: little padding; results are written back in the records' order.
    enc = tokenize({k: [r[k] for r in records] for k in ("prompt", "chosen", "rejected")})
    order = sorted(range(len(records)), key=lambda i: -max(len(enc["a_input_ids"][i]), len(enc["b_input_ids"][i])))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        examples = []
        for i in idx:
            a, b = ("a", "b") if not swaps[i] else ("b", "a")
            examples.append({"a_input_ids": enc[f"{a}_input_ids"][i], "a_response_start": enc[f"{a}_response_start"][i],
                             "b_input_ids": enc[f"{b}_input_ids"][i], "b_response_start": enc[f"{b}_response_start"][i],
                             "index": i})
        batch = collate(examples)
        batch = {k: v.to(model.device) for k, v in batch.items()}
        for i, m in zip(idx, model.pair_margins(batch).float().cpu().tolist()):
            margins[i] = m
    return margins


def compute_weak_labels(teacher_checkpoint: str, student_records: list[dict], test_records: dict[str, list[dict]],
                        seed: int, max_length: int, truncation: str, out_path: str,
                        batch_size: int = 64, device: Optional[str] = None,
                        validation_records: Optional[list[dict]] = None) -> dict:
    """Label the student half with the teacher, score every test split and the validation split (the `weak_val`
    selection rule's reference: the teacher's preferences, not gold); write the file at `out_path`.

    A `WeakLabeller` (`datamodules/preference/weak_labels.py`): labels that carry no information are refused before
    the test splits are scored (`check_informative`), and nothing is written then.
    """
    from datamodules.tokenizers import load_tokenizer

    model = load_teacher(teacher_checkpoint)
    model.eval().to(device or "cpu")
    tokenizer = load_tokenizer(model.tokenizer_name)
    swaps = [swap_order(r["id"], seed) for r in student_records]
    margins = score_pairs(model, tokenizer, student_records, swaps, max_length, truncation, batch_size)
    labels = {r["id"]: [float(torch.sigmoid(torch.tensor(m))), s] for r, m, s in zip(student_records, margins, swaps)}
    check_informative(margins, [q for q, _ in labels.values()], teacher_name(teacher_checkpoint))
    teacher_margins = {}
    for split, recs in test_records.items():
        m = score_pairs(model, tokenizer, recs, [False] * len(recs), max_length, truncation, batch_size)
        teacher_margins[split] = {r["id"]: v for r, v in zip(recs, m)}
    validation_margins = None
    if validation_records:
        m = score_pairs(model, tokenizer, validation_records, [False] * len(validation_records), max_length,
                        truncation, batch_size)
        validation_margins = {r["id"]: v for r, v in zip(validation_records, m)}
    return write_weak_labels(out_path, teacher_checkpoint, seed, model.tokenizer_name, labels, teacher_margins,
                             validation_margins)


def load_teacher(teacher_checkpoint: str, flag: str = "--data.teacher_checkpoint"):
    """The teacher as a `RewardModelModule`: loaded from a checkpoint, or an outside `hf_classifier:` model built as
    `cli.py test` builds it (`classifier_init_args`)."""
    from lightning_modules.checkpoint_checks import REWARD_CLASSES, load_checked
    from lightning_modules.export.hf_classifier import classifier_init_args
    from lightning_modules.reward.reward_model import RewardModelModule

    if is_hf_classifier(teacher_checkpoint):
        check_classifier_source(teacher_checkpoint, flag)
        try:
            return RewardModelModule(**classifier_init_args(teacher_checkpoint))
        except (OSError, ValueError) as err:
            raise ValueError(f"{flag} {teacher_checkpoint!r}: not a sequence-classification reward model that "
                             f"loads: {err}") from err
    # intact, a reward model's, finite: a corrupt or diverged teacher would label silently (all q = 0.5, or NaN)
    load_checked(teacher_checkpoint, flag, REWARD_CLASSES)
    try:
        return RewardModelModule.load_from_checkpoint(teacher_checkpoint, map_location="cpu")
    except (pickle.UnpicklingError, KeyError, RuntimeError, TypeError) as e:
        raise ValueError(f"{flag} {teacher_checkpoint!r} is not a RewardModelModule checkpoint "
                         f"of this version: {type(e).__name__}: {e}") from e


def attach_weak_labeller(datamodule) -> None:
    """Hand `compute_weak_labels` to a data module that labels pairs with a teacher (one with a `weak_labeller`
    attribute still unset); any other data module, or None, is left as it is."""
    if datamodule is not None and hasattr(datamodule, "weak_labeller") and datamodule.weak_labeller is None:
        datamodule.weak_labeller = compute_weak_labels
