"""How good each real weak supervisor of the VADER ICWSM corpus is, against the published mean rating (the crowd of
~20 raters), per domain and pair rule -- no model, seconds on a CPU (docs/vader_icwsm.md):

    python -m datamodules.preference.vader_supervisors [--min_delta 1.0] [--split all|test] [--json PATH]

Supervisors: the VADER lexicon (compound score of each text, `labeller:vader_lexicon`) and one rater (the k-th listed
score of each text, `labeller:one_rater:rater=k`; k = 0, and the mean over k = 0..14, the positions every text has).
Two accuracies per supervisor: `strict`, a tie (equal scores) counted wrong -- the protocol's rule (`val/acc`,
the teacher row) -- and `ties ½`, a tie counted half, as issue 48 measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
from typing import Optional

from datamodules.preference.labelling_functions import VaderLexicon
from datamodules.preference.vader_corpus import DOCUMENT_DOMAINS, DOMAINS, read_domain
from datamodules.preference.vader_pairs import DEFAULT_FRACTIONS, make_pairs, split_items

RATER_POSITIONS = 15  # every text has at least 15 listed ratings (movies: 15 .. 29; the others 20 or more)


def accuracy(pairs, score) -> dict[str, float]:
    """Share of (chosen, rejected) pairs the score orders as the crowd does: strict and with ties counted half (%)."""
    right = ties = 0
    for chosen, rejected in pairs:
        a, b = score(chosen), score(rejected)
        right += a > b
        ties += a == b
    n = len(pairs)
    return {"strict": 100.0 * right / n, "ties_half": 100.0 * (right + ties / 2) / n, "ties": 100.0 * ties / n}


def measure(domain: str, rule: str, min_delta: float, split: str = "all", corpus_dir: Optional[str] = None,
            seed: int = 0, lexicon: Optional[VaderLexicon] = None) -> dict:
    """Pairs of one domain under one rule (`split`: "all" the whole domain, or one split of the adapter's default
    split), with each supervisor's accuracy."""
    items = read_domain(domain, corpus_dir)
    if split != "all":
        items = split_items(items, DEFAULT_FRACTIONS, seed)[split]
    pairs = make_pairs(items, rule, min_delta, seed)
    lexicon = lexicon or VaderLexicon()
    raters = [accuracy(pairs, lambda it, k=k: it.ratings[k]) for k in range(RATER_POSITIONS)]
    gaps = [c.mean - r.mean for c, r in pairs]
    return {"domain": domain, "rule": rule, "min_delta": min_delta, "split": split, "pairs": len(pairs),
            "mean_gap": statistics.fmean(gaps),
            "vader_lexicon": accuracy(pairs, lambda it: lexicon.compound(it.text)),
            "one_rater": raters[0],
            "one_rater_mean": {k: statistics.fmean(r[k] for r in raters) for k in raters[0]},
            "one_rater_range": [min(r["strict"] for r in raters), max(r["strict"] for r in raters)]}


def measure_all(min_delta: float = 1.0, split: str = "all", corpus_dir: Optional[str] = None) -> list[dict]:
    lexicon = VaderLexicon()
    rows = []
    for domain in DOMAINS:
        rules = ["sorted", "random"] + (["within_document"] if domain in DOCUMENT_DOMAINS else [])
        rows += [measure(domain, rule, min_delta, split, corpus_dir, lexicon=lexicon) for rule in rules]
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| domain | pair rule | pairs | mean gap | VADER lexicon strict / ties ½ | one rater (k = 0) strict / "
             "ties ½ | one rater, mean over k = 0..14, strict [range] |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        v, o, m = r["vader_lexicon"], r["one_rater"], r["one_rater_mean"]
        lo, hi = r["one_rater_range"]
        lines.append(f"| {r['domain']} | {r['rule']} | {r['pairs']:,} | {r['mean_gap']:.2f} | "
                     f"{v['strict']:.1f} / {v['ties_half']:.1f} | {o['strict']:.1f} / {o['ties_half']:.1f} | "
                     f"{m['strict']:.1f} [{lo:.1f}, {hi:.1f}] |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min_delta", type=float, default=1.0)
    parser.add_argument("--split", choices=["all", *DEFAULT_FRACTIONS], default="all")
    parser.add_argument("--corpus_dir", default=None, help="a copy of the corpus (default: the installed one)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = measure_all(args.min_delta, args.split, args.corpus_dir)
    print(f"min_delta {args.min_delta:g}, split {args.split}; accuracies in % against the published mean rating")
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
