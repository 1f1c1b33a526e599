"""Weight averaging of reward models fine-tuned from one start (WARM, Ramé et al. 2024; docs/weight_averaging.md).

    θ_avg = Σ_k w_k · θ_k      w_k ≥ 0, Σ_k w_k = 1 (uniform 1/K by default)

over every tensor of the members' `state_dict` (backbone and head), in float64 and cast back to the tensor's dtype.
A tensor that is bit-identical in every member (the frozen embeddings and layers 1..`freeze_layers`) is copied, not
averaged, so the average keeps it bit-exact (and shares the members' cached frozen prefix). The result is a plain
`RewardModelModule` checkpoint: `cli.py test --ckpt_path`, `load_from_checkpoint` and `--data.teacher_checkpoint`
read it like any other.

An average only means something between members fine-tuned from the same weights (Wortsman et al. 2022: one basin).
In the W2S protocol those are the students of one seed: one pretrained backbone, the same frozen lower layers, the
same head init (one `--seed_everything`); objectives, `anchor_coef`, `l2sp_coef` may differ (a sweep). Refused, with
a ValueError naming the files: fewer than 2 members, a missing or corrupt checkpoint, another architecture (the
hyperparameters in `ARCHITECTURE_KEYS`), another data split (`DATA_SPLIT_KEYS`: another seed's), other tensor names /
shapes / dtypes, LoRA or outside-classifier members, and members whose frozen parameters differ (they did not start
from one pretrained model).

    python -m lightning_modules.reward.weight_averaging a.ckpt b.ckpt --out avg.ckpt [--weights 0.25 0.75]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import warnings
from typing import Any, Optional, Sequence

import lightning
import torch

from datamodules.atomic_files import atomic_write_json
from lightning_modules.checkpoint_checks import REWARD_CLASSES, load_checked
from lightning_modules.checkpoint_io import AtomicCheckpointIO

# What builds the network: members that differ here hold different functions under the same tensor names.
ARCHITECTURE_KEYS = ("backbone", "tokenizer", "tiny_config", "keep_layers", "vocab_limit", "pooling", "freeze_layers",
                     "lora", "quantization", "dtype")
# What decides which pairs a member trained on (`PreferenceDataModule`): another `--data.seed` is another seed's split
# into teacher and student halves, so an average across seeds would carry data a seed keeps from its student.
DATA_SPLIT_KEYS = ("source", "seed", "train_subset", "teacher_fraction", "val_fraction", "source_options",
                   "local_dirs", "max_pairs")
FLAG = "average_checkpoints"
# The backbone modules `RewardModelModule._freeze_lower_layers` freezes (`_embedding_modules`, `_transformer_layers`):
# BERT's `embeddings` block, GPT-2's `wte` / `wpe`, a rotary decoder's `embed_tokens`; layers under these lists.
_EMBEDDINGS = ("embeddings", "embed_tokens", "wte", "wpe")
_LAYER = re.compile(r"^(?:layers|h|encoder\.layer)\.(\d+)\.")


def average_checkpoints(paths: Sequence[str], out_path: str, weights: Optional[Sequence[float]] = None) -> str:
    """Write the weighted average of reward-model checkpoints that share a start as a new checkpoint.

    Args:
        paths: the members' Lightning checkpoints (`RewardModelModule`), at least 2; a path given twice counts twice.
        out_path: the new checkpoint, written atomically (complete or absent); its record of what was averaged goes
            inside it (key `weight_averaging`) and beside it (`<out_path>.json`).
        weights: one non-negative weight per member, summing to 1 (within 1e-6; then divided by their sum); None
            is the uniform average.

    Returns:
        `out_path`.
    """
    paths = [os.fspath(p) for p in paths]
    if len(paths) < 2:
        raise ValueError(f"{FLAG}: averaging needs at least 2 checkpoints, got {len(paths)} ({paths}); a single "
                         "checkpoint is already its own average")
    weights = check_weights(weights, len(paths))
    for path in paths:
        if os.path.realpath(path) == os.path.realpath(out_path):
            raise ValueError(f"{FLAG}: the output {out_path!r} is one of the members; write the average elsewhere")
    ckpts = [load_member(p) for p in paths]
    hparams = [c.get("hyper_parameters") or {} for c in ckpts]
    check_architecture(paths, hparams)
    data = [c.get("datamodule_hyper_parameters") or {} for c in ckpts]
    check_data_split(paths, data)
    states = [c["state_dict"] for c in ckpts]
    check_state_dicts(paths, states)
    frozen = check_shared_start(paths, states, int(hparams[0].get("freeze_layers") or 0))
    record = {
        "method": "weight averaging (WARM): sum_k w_k * theta_k over every state_dict tensor",
        "members": [os.path.abspath(p) for p in paths],
        "weights": weights,
        "shared_start": {"freeze_layers": int(hparams[0].get("freeze_layers") or 0),
                         "frozen_tensors_identical": len(frozen), "verified": bool(frozen)},
        "hyperparameters_that_differ": _plain(differing_hyperparameters(hparams)),
        "data_hyperparameters_that_differ": _plain(differing_hyperparameters(data)),
    }
    out = {"pytorch-lightning_version": ckpts[0].get("pytorch-lightning_version") or lightning.__version__,
           "state_dict": average_state_dicts(states, weights),
           "hyper_parameters": dict(hparams[0]),  # the first member's (its training options among them)
           "weight_averaging": record}
    for key in ("hparams_name", "datamodule_hparams_name", "datamodule_hyper_parameters"):  # provenance: the split
        if key in ckpts[0]:
            out[key] = ckpts[0][key]
    AtomicCheckpointIO(chosen_by=f"{FLAG}'s out_path", flag=FLAG).save_checkpoint(out, out_path)
    atomic_write_json(record, averaging_record_path(out_path), chosen_by=f"{FLAG}'s out_path")
    return out_path


def averaging_record_path(out_path: str) -> str:
    """The JSON beside an averaged checkpoint: its members and weights."""
    return f"{out_path}.json"


def check_weights(weights: Optional[Sequence[float]], n: int) -> list[float]:
    """The members' weights as floats summing to 1 (uniform when None); refuses other counts, negative or
    non-finite values and sums other than 1."""
    if weights is None:
        return [1.0 / n] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise ValueError(f"{FLAG}: {len(weights)} weight(s) {weights} for {n} checkpoints; give one per checkpoint")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"{FLAG}: weights must be finite and >= 0, got {weights}")
    total = sum(weights)
    if abs(total - 1.0) > 1e-6:
        hint = f"; normalised: {[w / total for w in weights]}" if total > 0 else ""
        raise ValueError(f"{FLAG}: weights must sum to 1, got {weights} (sum {total}){hint}")
    return [w / total for w in weights]


def load_member(path: str) -> dict[str, Any]:
    """A member's checkpoint: intact, a `RewardModelModule`'s, finite (`load_checked`); not LoRA, not an outside
    classifier."""
    ckpt = load_checked(path, FLAG, REWARD_CLASSES)
    hparams = ckpt.get("hyper_parameters") or {}
    if str(hparams.get("backbone", "")).startswith("hf_classifier:"):
        raise ValueError(f"{FLAG}: {path!r} is an outside reward model ({hparams['backbone']}) that is not "
                         "fine-tuned here: there is no shared start to average from; ensemble it instead "
                         "(lightning_modules.reward.ensemble.RewardEnsembleModule)")
    return ckpt


def check_architecture(paths: Sequence[str], hparams: Sequence[dict]) -> None:
    """The hyperparameters that build the network (`ARCHITECTURE_KEYS`) must be equal; LoRA members are refused."""
    first = _architecture(hparams[0])
    for path, hp in zip(paths[1:], hparams[1:]):
        other = _architecture(hp)
        differ = [f"--model.{k}: {paths[0]!r} has {first[k]!r}, {path!r} has {other[k]!r}" for k in ARCHITECTURE_KEYS
                  if first[k] != other[k]]
        if differ:
            raise ValueError(f"{FLAG}: {paths[0]!r} and {path!r} are different architectures, whose weights do not "
                             "correspond:\n  " + "\n  ".join(differ))
    if first["lora"] is not None:
        # mean(B_k) · mean(A_k) is not mean(B_k · A_k): averaging the factors is no average of the weight updates
        raise ValueError(f"{FLAG}: {', '.join(repr(p) for p in paths)} are LoRA models (--model.lora "
                         f"{first['lora']!r}): averaging the adapters' factors A and B separately is not an average "
                         "of their weight updates B·A; ensemble them instead "
                         "(lightning_modules.reward.ensemble.RewardEnsembleModule)")


def check_data_split(paths: Sequence[str], data: Sequence[dict]) -> None:
    """Members trained on another data split (`DATA_SPLIT_KEYS` of the saved data hyperparameters, when the
    checkpoints hold them: LightningCLI's do) are refused: in the W2S protocol they are other seeds' students."""
    for path, hp in zip(paths[1:], data[1:]):
        if not data[0] or not hp:
            continue
        differ = [f"--data.{k}: {data[0].get(k)!r} vs {hp.get(k)!r}" for k in DATA_SPLIT_KEYS
                  if data[0].get(k) != hp.get(k)]
        if differ:
            raise ValueError(
                f"{FLAG}: {paths[0]!r} and {path!r} were trained on different data splits ({'; '.join(differ)}). "
                "Another --data.seed is another seed's split into teacher and student halves: a cross-seed average "
                "is no average of one start's fine-tunes and would carry data this seed keeps from its student. "
                "Average the students of one seed only")


def _architecture(hparams: dict) -> dict[str, Any]:
    values = {k: hparams.get(k) for k in ARCHITECTURE_KEYS}
    values["tokenizer"] = values["tokenizer"] or values["backbone"]  # RewardModelModule's default
    values["freeze_layers"] = int(values["freeze_layers"] or 0)
    if values["lora"] is not None and not isinstance(values["lora"], dict):  # a LoraSpec from a bare constructor
        values["lora"] = dict(vars(values["lora"]))
    return values


def check_state_dicts(paths: Sequence[str], states: Sequence[dict]) -> None:
    """Same tensor names, shapes and dtypes in every member as in the first."""
    first = states[0]
    for path, state in zip(paths[1:], states[1:]):
        only_first, only_other = sorted(set(first) - set(state)), sorted(set(state) - set(first))
        if only_first or only_other:
            lora = any("lora_" in k for k in only_first + only_other)
            raise ValueError(
                f"{FLAG}: {paths[0]!r} and {path!r} hold different tensors: only in the first "
                f"{only_first[:4]}{' ...' if len(only_first) > 4 else ''}, only in the second {only_other[:4]}"
                f"{' ...' if len(only_other) > 4 else ''}" + (" (a LoRA member among full fine-tunes)" if lora else ""))
        differ = [f"{k}: {tuple(v.shape)} {v.dtype} vs {tuple(state[k].shape)} {state[k].dtype}"
                  for k, v in first.items()
                  if torch.is_tensor(v) and (v.shape != state[k].shape or v.dtype != state[k].dtype)]
        if differ:
            raise ValueError(f"{FLAG}: {paths[0]!r} and {path!r} have tensors of other shapes or dtypes: "
                             + "; ".join(differ[:4]))


def frozen_start_keys(keys: Sequence[str], freeze_layers: int) -> list[str]:
    """The `state_dict` keys that `--model.freeze_layers k` keeps frozen during fine-tuning: the backbone's
    embeddings and transformer layers 1..k (none when k = 0)."""
    if freeze_layers <= 0:
        return []
    frozen = []
    for key in keys:
        if not key.startswith("backbone."):
            continue
        name = key[len("backbone."):]
        layer = _LAYER.match(name)
        if name.split(".", 1)[0] in _EMBEDDINGS or (layer is not None and int(layer[1]) < freeze_layers):
            frozen.append(key)
    return frozen


def check_shared_start(paths: Sequence[str], states: Sequence[dict], freeze_layers: int) -> list[str]:
    """The frozen parameters must be bit-identical in every member: otherwise they were not fine-tuned from one
    pretrained model. Returns the compared keys; with `freeze_layers` 0 nothing is frozen, so nothing can be
    compared (a warning says the shared start is assumed)."""
    keys = frozen_start_keys(list(states[0]), freeze_layers)
    if not keys:
        warnings.warn(f"{FLAG}: --model.freeze_layers {freeze_layers}: no parameter stays frozen during fine-tuning, "
                      "so whether the members share a start cannot be checked; averaging assumes they do (the "
                      "students of one seed)", UserWarning, stacklevel=3)
        return []
    for path, state in zip(paths[1:], states[1:]):
        differ = [k for k in keys if not torch.equal(states[0][k], state[k])]
        if differ:
            raise ValueError(
                f"{FLAG}: {paths[0]!r} and {path!r} do not share a start: parameters that --model.freeze_layers "
                f"{freeze_layers} keeps frozen during fine-tuning differ ({', '.join(differ[:4])}"
                f"{', ...' if len(differ) > 4 else ''}), so they were not fine-tuned from one pretrained model "
                "(another backbone, or a tiny random backbone built under another --seed_everything). Average the "
                "students of one seed only")
    return keys


def average_state_dicts(states: Sequence[dict], weights: Sequence[float]) -> dict[str, Any]:
    """Σ_k w_k · state_k per tensor, in float64, cast back to the tensor's dtype. Tensors equal in every member are
    copied bit-exact; non-floating tensors (integer buffers) must be equal."""
    out = {}
    for key, first in states[0].items():
        values = [s[key] for s in states]
        if not torch.is_tensor(first):
            out[key] = first
            continue
        if all(torch.equal(first, v) for v in values[1:]):
            out[key] = first.clone()
            continue
        if not first.is_floating_point():
            raise ValueError(f"{FLAG}: {key} ({first.dtype}) differs between members and cannot be averaged")
        acc = weights[0] * values[0].to(torch.float64)
        for w, v in zip(weights[1:], values[1:]):
            acc = acc + w * v.to(torch.float64)  # not add_(alpha=w): a fused multiply-add rounds otherwise
        out[key] = acc.to(first.dtype)
    return out


def differing_hyperparameters(hparams: Sequence[dict]) -> dict[str, list]:
    """key -> one value per member, for the hyperparameters that are not the same in every member."""
    keys = sorted({k for hp in hparams for k in hp if not k.startswith("_")})
    return {k: [hp.get(k) for hp in hparams] for k in keys if any(hp.get(k) != hparams[0].get(k) for hp in hparams)}


def _plain(value: Any) -> Any:
    """JSON types only (the record is read back by `torch.load(weights_only=True)` and written as JSON)."""
    return json.loads(json.dumps(value, default=repr))


def main(argv: Optional[Sequence[str]] = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m lightning_modules.reward.weight_averaging",
                                     description="Average reward-model checkpoints that share a start (WARM).")
    parser.add_argument("checkpoints", nargs="+", help="the members' .ckpt files (at least 2)")
    parser.add_argument("--out", required=True, help="the averaged checkpoint to write")
    parser.add_argument("--weights", nargs="+", type=float, default=None,
                        help="one weight per checkpoint, >= 0, summing to 1 (default: uniform)")
    args = parser.parse_args(argv)
    try:
        path = average_checkpoints(args.checkpoints, args.out, args.weights)
    except ValueError as err:  # a refusal: its message, not a traceback
        parser.error(str(err))
    print(f"wrote {path} (members and weights: {averaging_record_path(path)})")
    return path


if __name__ == "__main__":
    from command_errors import exit_with, run_command  # one line per failure, --traceback for the traceback

    exit_with(run_command(main, prog="python -m lightning_modules.reward.weight_averaging"))
