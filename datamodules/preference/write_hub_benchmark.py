"""Write a generated preference benchmark as files in the real hub schemas, read back through the hub adapters with
`--data.local_dirs` (docs/hub_benchmarks.md):

    python -m datamodules.preference.write_hub_benchmark --benchmark advice --out /tmp/bench/advice
    python -m datamodules.preference.write_hub_benchmark --benchmark helpful_hard_hub --out /tmp/bench/helpful_hard_hub

Benchmarks (domain -> hub schema; the source first, then the targets in the order of the data config):

    advice            gardening -> ultrafeedback (cue 0.85), fitness -> hh_helpful (0.5), music -> helpsteer3 (0.15),
                      pets -> rail (no cue); `synthetic_advice`, configs/data/bench_advice.yaml
    helpful_hard_hub  the shipped generator's helpful category at difficulty "hard": cooking -> hh_helpful (0.85),
                      science -> helpsteer3 (0.5), travel -> ultrafeedback (0.15), tech -> rail (no artifact);
                      configs/data/bench_helpful_hard_hub.yaml

The source gets its train and test splits (its schema has no validation split: the data module carves one from
train), each target its test split. Every split also holds ~2% of rows the adapter drops (`hub_writer.hub_rows`),
so after loading a split has exactly the requested pairs. Files: DIR/<hub name>/<hub split>.jsonl, each replaced
atomically, and DIR/manifest.json (sizes, drops by reason, cue rates measured on the written text).
"""
from __future__ import annotations

import argparse
import json
import os
import random
from collections import Counter
from typing import Callable, Optional

from datamodules.atomic_files import atomic_write, atomic_write_json
from datamodules.preference import hub_writer, synthetic_advice, synthetic_lexicon, synthetic_shift
from datamodules.preference import synthetic_advice_lexicon as advice_lex

MULTI_TURN_RATE = 0.5  # P(a prompt with a lead sentence is written as lead, acknowledgement, request turns)
# Acknowledgements for the shipped generator's text: words of `synthetic_vocabulary()` only, so its builtin
# word-level tokenizer still covers every prompt.
SHIFT_ACKNOWLEDGEMENTS = ("Of course. What is your question?", "Sure, I can help. What is your question?",
                          "I can help with that. What is it?")


def _advice_rows(domain: str, split: str, n: int, seed: int) -> list[dict]:
    return synthetic_advice.generate_domain(domain, split, n, seed=seed)


def _shift_rows(domain: str, split: str, n: int, seed: int) -> list[dict]:
    rows = synthetic_shift.generate_domain("helpful", domain, split, difficulty="hard", seed=seed, **{f"n_{split}": n})
    leads = [x for x in synthetic_lexicon.SHARED_LEADS + synthetic_lexicon.HELPFUL_DOMAINS[domain]["leads"] if x]
    for row in rows:  # the generator joins lead and request with a space; recover them for multi-turn prompts
        lead = next((x for x in sorted(leads, key=len, reverse=True) if row["prompt"].startswith(x + " ")), "")
        row["lead"], row["request"] = lead, row["prompt"][len(lead):].lstrip()
    return rows


BENCHMARKS: dict[str, dict] = {
    "advice": {
        "layout": [("gardening", "ultrafeedback", "source"), ("fitness", "hh_helpful", "target"),
                   ("music", "helpsteer3", "target"), ("pets", "rail", "target")],
        "rows": _advice_rows, "has_cue": synthetic_advice.has_cue, "acknowledgements": advice_lex.ACKNOWLEDGEMENTS,
        "n_train": 1600, "config": "configs/data/bench_advice.yaml",
    },
    "helpful_hard_hub": {
        "layout": [("cooking", "hh_helpful", "source"), ("science", "helpsteer3", "target"),
                   ("travel", "ultrafeedback", "target"), ("tech", "rail", "target")],
        "rows": _shift_rows, "has_cue": lambda text: synthetic_shift.has_artifact("helpful", text),
        "acknowledgements": SHIFT_ACKNOWLEDGEMENTS, "n_train": 2000,
        "config": "configs/data/bench_helpful_hard_hub.yaml",
    },
}


def prompt_messages(lead: str, request: str, acknowledgements: tuple[str, ...], rng: random.Random) -> list[dict]:
    """One user turn "lead request", or -- for half of the prompts with a lead -- lead / acknowledgement / request."""
    if lead and rng.random() < MULTI_TURN_RATE:
        return [{"role": "user", "content": lead}, {"role": "assistant", "content": rng.choice(acknowledgements)},
                {"role": "user", "content": request}]
    return [{"role": "user", "content": f"{lead} {request}" if lead else request}]


def build_benchmark(benchmark: str, n_train: Optional[int] = None, n_test: int = 300, seed: int = 0) -> dict:
    """{(hub name, hub split): {"rows", "pairs", "dropped", "domain", "role", "split", "cue"}} of one benchmark."""
    spec = BENCHMARKS[benchmark]
    n_train = spec["n_train"] if n_train is None else n_train
    for flag, n in (("--n_train", n_train), ("--n_test", n_test)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{flag} must be a positive integer, got {n!r}")
    from datamodules.preference.sources import build_source

    out = {}
    for domain, schema, role in spec["layout"]:
        splits = {"train": n_train, "test": n_test} if role == "source" else {"test": n_test}
        for split, n in splits.items():
            rows = spec["rows"](domain, split, n + hub_writer.spares_needed(schema, n), seed)
            coins = random.Random(f"{benchmark}/{domain}/{split}/{seed}/turns")
            pairs = [{"prompt": prompt_messages(r["lead"], r["request"], spec["acknowledgements"], coins),
                      "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]
            hub_split = build_source(schema).split_map[split]
            written, dropped = hub_writer.hub_rows(schema, pairs[:n], pairs[n:], f"{benchmark}/{schema}/{split}/{seed}")
            out[(schema, hub_split)] = {"rows": written, "pairs": pairs[:n], "dropped": dropped, "domain": domain,
                                        "role": role, "split": split, "cue": cue_rates(pairs[:n], spec["has_cue"])}
    return out


def cue_rates(pairs: list[dict], has_cue: Callable[[str], bool]) -> dict:
    """Share of pairs with the cue on the chosen response only, on the rejected only, on both, on neither."""
    counts = Counter((has_cue(p["chosen"]), has_cue(p["rejected"])) for p in pairs)
    n = len(pairs)
    return {"chosen": counts[True, False] / n, "rejected": counts[False, True] / n,
            "both": counts[True, True] / n, "neither": counts[False, False] / n}


def write_benchmark(benchmark: str, out: str, n_train: Optional[int] = None, n_test: int = 300,
                    seed: int = 0) -> dict:
    """Write the files and DIR/manifest.json; returns the manifest."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"--benchmark must be one of {sorted(BENCHMARKS)}, got {benchmark!r}")
    manifest_path = os.path.join(out, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            previous = json.load(f).get("benchmark")
        if previous != benchmark:  # both write hh_helpful/test.jsonl, ...: one benchmark per folder
            raise ValueError(f"--out {out} holds the {previous!r} benchmark; write {benchmark!r} to another folder")
    built = build_benchmark(benchmark, n_train, n_test, seed)
    files = {}
    for (schema, hub_split), part in built.items():
        path = os.path.join(out, schema, hub_split + ".jsonl")
        atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part["rows"]), "--out")
        files[f"{schema}/{hub_split}"] = {
            "domain": part["domain"], "role": part["role"], "split": part["split"], "rows": len(part["rows"]),
            "pairs": len(part["pairs"]), "dropped": dict(sorted(part["dropped"].items())),
            "cue": {k: round(v, 4) for k, v in part["cue"].items()}}
    schemas = list(dict.fromkeys(schema for schema, _ in built))
    manifest = {"benchmark": benchmark, "seed": seed, "n_train": n_train or BENCHMARKS[benchmark]["n_train"],
                "n_test": n_test, "config": BENCHMARKS[benchmark]["config"],
                "local_dirs": {s: os.path.abspath(os.path.join(out, s)) for s in schemas}, "files": files}
    atomic_write_json(manifest, manifest_path, chosen_by="--out")
    return manifest


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS))
    parser.add_argument("--out", required=True, help="folder to write DIR/<hub name>/<hub split>.jsonl into")
    parser.add_argument("--n_train", type=int, default=None,
                        help="source train pairs after drops (default: 1600 for advice, 2000 for helpful_hard_hub)")
    parser.add_argument("--n_test", type=int, default=300, help="test pairs after drops, per domain")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        manifest = write_benchmark(args.benchmark, args.out, args.n_train, args.n_test, args.seed)
    except ValueError as err:
        parser.error(str(err))
    for name, f in manifest["files"].items():
        print(f"{name:28s} {f['domain']:9s} {f['role']:6s} {f['pairs']:5d} pairs + {f['rows'] - f['pairs']} to drop "
              f"{f['dropped']}  cue on chosen {f['cue']['chosen']:.3f}, rejected {f['cue']['rejected']:.3f}")
    print(f"\n--config {manifest['config']} --data.local_dirs '{json.dumps(manifest['local_dirs'])}'")
    return manifest


if __name__ == "__main__":
    from command_errors import exit_with, run_command  # one line per failure, --traceback for the traceback

    exit_with(run_command(main, prog="python -m datamodules.preference.write_hub_benchmark"))
