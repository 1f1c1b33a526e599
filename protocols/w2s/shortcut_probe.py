"""A teacher's structure without generator metadata, read with a response-only shortcut probe (issue 29).

    python -m protocols.w2s.shortcut_probe --ckpt <teacher .ckpt> --data_config configs/data/synth_helpful.yaml \
        [--source_options '{...}'] [--teacher_source_options '{...}'] [--local_dirs '{...}'] [--seed 0]

Like a hypothesis-only baseline in NLI, the probe sees the two responses of a pair and never the prompt. It is fitted
on the teacher half's gold pairs (the labels the teacher trained on) and scored on the validation split: that
accuracy is the data's *shortcut strength*. Where the preference rule needs the prompt, whatever the responses alone
predict is a shortcut, so on any split:

- the pairs split into *probe right* (the shortcut agrees with gold) and *probe wrong* (the shortcut misleads);
- teacher accuracy where the probe is wrong is how much rule the teacher follows where the shortcut misleads
  (the analogue of `protocols.w2s.teacher_structure`'s accuracy with the artifact on the rejected response);
- a teacher error on a probe-wrong pair picks the probe's response against gold: a *shortcut error*. Their share
  of the teacher's errors, beside the probe-wrong share of all pairs (what it would be if errors ignored the
  shortcut), says how far the errors concentrate where the shortcut misleads.

The probe is deliberately weak: L2-regularised logistic regression on hashed, binary word uni- and bigram features
(plus a log-length feature) of each response, scored as w·(φ(a) − φ(b)) with no intercept, so it can only learn
cues that live *inside* one response (words, openers, closers, length). It cannot compare a response with the
prompt, so it cannot learn a rule that needs the prompt; a richer probe (a transformer over both responses) would
start to infer the rule from the responses' content alone and blur the line between shortcut and rule. The limit:
on real data much genuine quality is response-local (fluency, correctness, refusals of plainly harmful steps); the
probe learns that too, and probe-agreeing errors then overstate shortcut errors (docs/teacher_structure.md).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import yaml

from datamodules.preference.weak_labels import swap_order

N_FEATURES = 2 ** 16
L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)  # searched on a held-out fifth of the teacher half
HOLDOUT_SHARE = 0.2
_WORD_RE = re.compile(r"\w+|[^\w\s]+")  # the synthetic benchmark's word split (synthetic_shift.split_words)
_LENGTH = 0  # feature 0 is reserved for log(1 + number of words)


def response_features(text: str, n_features: int = N_FEATURES) -> dict[int, float]:
    """Signed hashed features of one response: presence of each word uni- and bigram (with start / end marks,
    so an opener differs from the same word inside the text) and log(1 + its word count) in feature 0.

    The hash is sha1, not Python's `hash` (salted per process): features are the same in every run.
    """
    words = ["<s>", *_WORD_RE.findall(text.lower()), "</s>"]
    grams = set(words[1:-1]) | {f"{a} {b}" for a, b in zip(words, words[1:])}
    feats: dict[int, float] = {_LENGTH: math.log1p(len(words) - 2)}
    for g in grams:
        h = int.from_bytes(hashlib.sha1(g.encode("utf-8")).digest()[:8], "little")
        index = 1 + (h >> 1) % (n_features - 1)
        feats[index] = feats.get(index, 0.0) + (1.0 if h & 1 else -1.0)  # signed: collisions cancel on average
    return feats


class PairMatrix:
    """φ(a) − φ(b) for a list of pairs, as sparse (row, column, value) triplets."""

    def __init__(self, pairs: Sequence[tuple[str, str]], n_features: int = N_FEATURES):
        rows, cols, vals = [], [], []
        cache: dict[str, dict[int, float]] = {}
        for i, (a, b) in enumerate(pairs):
            for text in (a, b):
                if text not in cache:
                    cache[text] = response_features(text, n_features)
            fa, fb = cache[a], cache[b]
            diff = dict(fa)
            for k, v in fb.items():
                diff[k] = diff.get(k, 0.0) - v
            for k in sorted(diff):
                if diff[k] != 0.0:
                    rows.append(i), cols.append(k), vals.append(diff[k])
        self.n, self.d = len(pairs), n_features
        self.rows = torch.tensor(rows, dtype=torch.long)
        self.cols = torch.tensor(cols, dtype=torch.long)
        self.vals = torch.tensor(vals, dtype=torch.float64)

    def matvec(self, w: torch.Tensor) -> torch.Tensor:  # X w: (n,)
        return torch.zeros(self.n, dtype=w.dtype).index_add_(0, self.rows, self.vals * w[self.cols])

    def rmatvec(self, g: torch.Tensor) -> torch.Tensor:  # Xᵀ g: (d,)
        return torch.zeros(self.d, dtype=g.dtype).index_add_(0, self.cols, self.vals * g[self.rows])


def fit_logistic(X: PairMatrix, y: torch.Tensor, l2: float, max_iter: int = 300) -> torch.Tensor:
    """argmin_w mean softplus(−y · Xw) + l2/2 ‖w‖², y ∈ {−1, +1}, by full-batch L-BFGS (deterministic)."""
    w = torch.zeros(X.d, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=max_iter, tolerance_grad=1e-7, tolerance_change=1e-10,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        with torch.no_grad():
            z = y * X.matvec(w)
            loss = torch.nn.functional.softplus(-z).mean() + 0.5 * l2 * (w * w).sum()
            g = -y * torch.sigmoid(-z) / X.n  # d loss / d (Xw)
            w.grad = X.rmatvec(g) + l2 * w
        return loss

    opt.step(closure)
    return w.detach()


@dataclass
class ShortcutProbe:
    """A fitted response-only probe: `margins` > 0 where it prefers the chosen response."""

    weights: torch.Tensor
    l2: float
    n_features: int = N_FEATURES

    @classmethod
    def fit(cls, records: list[dict], seed: int = 0, l2: Optional[float] = None,
            n_features: int = N_FEATURES) -> "ShortcutProbe":
        """Fit on gold pairs; each pair shown as (a, b) in the project's seeded order (`swap_order`: a = rejected
        when swapped), label a ≻ b. (With an antisymmetric, intercept-free model a swap flips both the features
        and the label, so the fit does not depend on the coin; it keeps the pairs as the protocol presents them.)
        l2 None: chosen from `L2_GRID` by accuracy on a seeded held-out fifth, then refitted on all pairs.
        """
        if not records:
            raise ValueError("the shortcut probe needs at least one gold pair to fit on")
        swaps = [swap_order(r["id"], seed) for r in records]
        pairs = [(r["rejected"], r["chosen"]) if s else (r["chosen"], r["rejected"]) for r, s in zip(records, swaps)]
        y = torch.tensor([-1.0 if s else 1.0 for s in swaps], dtype=torch.float64)
        if l2 is None:
            l2 = cls._select_l2(records, pairs, y, seed, n_features)
        return cls(fit_logistic(PairMatrix(pairs, n_features), y, l2), l2, n_features)

    @staticmethod
    def _select_l2(records, pairs, y, seed: int, n_features: int) -> float:
        held = [_held_out(r["id"], seed) for r in records]
        fit_idx = [i for i, h in enumerate(held) if not h]
        val_idx = [i for i, h in enumerate(held) if h]
        if not fit_idx or not val_idx:
            return L2_GRID[len(L2_GRID) // 2]
        X_fit = PairMatrix([pairs[i] for i in fit_idx], n_features)
        X_val = PairMatrix([pairs[i] for i in val_idx], n_features)
        y_fit, y_val = y[fit_idx], y[val_idx]
        best = None
        for l2 in sorted(L2_GRID, reverse=True):  # ties go to the stronger penalty (the simpler probe)
            acc = float(((X_val.matvec(fit_logistic(X_fit, y_fit, l2)) * y_val) > 0).double().mean())
            if best is None or acc > best[0]:
                best = (acc, l2)
        return best[1]

    def margins(self, records: list[dict]) -> list[float]:
        """w·(φ(chosen) − φ(rejected)) per record."""
        X = PairMatrix([(r["chosen"], r["rejected"]) for r in records], self.n_features)
        return X.matvec(self.weights).tolist()

    def accuracy(self, records: list[dict]) -> float:
        """Percent of pairs where the probe prefers the chosen response (a margin of 0 counts as wrong)."""
        m = self.margins(records)
        return 100.0 * sum(v > 0 for v in m) / len(m)


def _held_out(record_id: str, seed: int) -> bool:
    digest = hashlib.sha1(f"probe-holdout:{seed}:{record_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") < HOLDOUT_SHARE * 2 ** 32


def _acc(rights: list[bool]) -> Optional[float]:
    return 100.0 * sum(rights) / len(rights) if rights else None


def split_structure(teacher_margins: Sequence[float], probe_margins: Sequence[float]) -> dict:
    """The teacher's structure on one split, from its margins and the probe's (both chosen − rejected; > 0 right).

    Pairs where the probe's margin is exactly 0 (it cannot tell the responses apart) are counted as
    `probe_undecided` and left out of both subsets (they still count in `teacher_acc` and the errors).
    Accuracies and shares in percent, None on an empty subset.
    """
    if len(teacher_margins) != len(probe_margins):
        raise ValueError(f"{len(teacher_margins)} teacher margins vs {len(probe_margins)} probe margins")
    right = [t > 0 for t in teacher_margins]
    probe_right = [i for i, p in enumerate(probe_margins) if p > 0]
    probe_wrong = [i for i, p in enumerate(probe_margins) if p < 0]
    errors = [i for i, r in enumerate(right) if not r]
    shortcut = [i for i in errors if probe_margins[i] < 0]  # wrong with the probe, i.e. agreeing with it
    n = len(right)
    return {
        "pairs": n,
        "teacher_acc": _acc(right),
        "probe_acc": _acc([p > 0 for p in probe_margins]),
        "probe_right": {"pairs": len(probe_right), "teacher_acc": _acc([right[i] for i in probe_right])},
        "probe_wrong": {"pairs": len(probe_wrong), "teacher_acc": _acc([right[i] for i in probe_wrong])},
        "probe_undecided": n - len(probe_right) - len(probe_wrong),
        "teacher_errors": len(errors),
        "shortcut_errors": len(shortcut),
        "shortcut_error_share": 100.0 * len(shortcut) / len(errors) if errors else None,
        "probe_wrong_share": 100.0 * len(probe_wrong) / n if n else None,
    }


def _cell(value: Optional[float], pairs: Optional[int] = None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" + (f" ({pairs})" if pairs is not None else "")


def markdown(structure: dict[str, dict]) -> str:
    lines = ["| split | teacher acc (pairs) | probe acc | teacher acc, probe right (pairs) | "
             "teacher acc, probe wrong (pairs) | shortcut errors / teacher errors | probe-wrong share of pairs |",
             "|---|---|---|---|---|---|---|"]
    for kind, s in structure.items():
        share = "–" if s["shortcut_error_share"] is None else \
            f"{s['shortcut_error_share']:.1f} ({s['shortcut_errors']}/{s['teacher_errors']})"
        lines.append(f"| {kind} | {_cell(s['teacher_acc'], s['pairs'])} | {_cell(s['probe_acc'])} | "
                     f"{_cell(s['probe_right']['teacher_acc'], s['probe_right']['pairs'])} | "
                     f"{_cell(s['probe_wrong']['teacher_acc'], s['probe_wrong']['pairs'])} | {share} | "
                     f"{_cell(s['probe_wrong_share'])} |")
    return "\n".join(lines)


def load_split_records(data_init: dict, seed: int) -> tuple[dict[str, list[dict]], object]:
    """Records per split kind as the protocol draws them (as `protocols.w2s.teacher_structure` loads them)."""
    from datamodules.preference.datamodule import PreferenceDataModule

    dm = PreferenceDataModule(**{**data_init, "train_subset": "student", "seed": seed})
    records, _ = dm.load_records()
    return records, dm


def measure(ckpt: str, data_init: dict, seed: int) -> dict:
    """Fit the probe on the teacher half, score it on validation, and the teacher's structure on the student half
    and every test split. Returns {"probe": {...}, "structure": {split: split_structure(...)}}."""
    from lightning_modules.reward.weak_labeller import load_teacher, score_pairs
    from datamodules.tokenizers import load_tokenizer

    records, dm = load_split_records(data_init, seed)
    probe = ShortcutProbe.fit(records["train_teacher"], seed=seed)
    model = load_teacher(ckpt, "--ckpt").eval()
    tok = load_tokenizer(model.tokenizer_name)
    structure = {}
    for kind, recs in records.items():
        if kind in ("validation", "train_teacher"):
            continue
        margins = score_pairs(model, tok, recs, [False] * len(recs), dm.hparams.max_length, dm.hparams.truncation)
        structure[kind] = split_structure(margins, probe.margins(recs))
    return {"probe": {"l2": probe.l2, "fit_pairs": len(records["train_teacher"]),
                      "validation_pairs": len(records["validation"]),
                      "shortcut_strength": probe.accuracy(records["validation"])},
            "structure": structure}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, help="the teacher: a RewardModelModule checkpoint (or hf_classifier:)")
    parser.add_argument("--data_config", required=True, help="the protocol's data config (data: init_args: ...)")
    for flag in ("source_options", "teacher_source_options", "local_dirs"):
        parser.add_argument(f"--{flag}", type=json.loads, default=None, help=f"JSON, as --data.{flag}")
    parser.add_argument("--seed", type=int, default=0, help="the protocol seed (which pairs form each half)")
    args = parser.parse_args(argv)
    with open(args.data_config, encoding="utf-8") as f:
        init = dict((yaml.safe_load(f).get("data") or {}).get("init_args") or {})
    for flag in ("source_options", "teacher_source_options", "local_dirs"):
        if getattr(args, flag) is not None:
            init[flag] = getattr(args, flag)
    result = measure(args.ckpt, init, args.seed)
    p = result["probe"]
    print(f"shortcut strength (response-only probe, fitted on {p['fit_pairs']} teacher-half pairs, l2 {p['l2']:g}): "
          f"{p['shortcut_strength']:.1f}% on {p['validation_pairs']} validation pairs\n")
    print(markdown(result["structure"]))
    return result


if __name__ == "__main__":
    from protocols.engine.refusals import run_main

    run_main(main)
