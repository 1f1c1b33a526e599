"""Preference files in TRL's standard layout, to try the commands for one's own data before having any.

    python -m datamodules.preference.example_files DIR [--n_train 400] [--n_test 200] [--seed 0]

writes, one JSON object `{"prompt": str, "chosen": str, "rejected": str}` a line:

    DIR/my_pairs/train.jsonl   the in-distribution source (a folder: `--data.source local:DIR/my_pairs`)
    DIR/my_pairs/test.jsonl    its held-out split (what `cli.py test` scores as the ID split)
    DIR/my_ood.jsonl           another domain, never trained on (`--data.ood_targets '["local:DIR/my_ood.jsonl"]'`)

The pairs are the synthetic benchmark's (docs/synthetic_benchmark.md): cooking questions as the source, travel
questions as the shifted target, where the surface cue that goes with the chosen answer in the source goes with the
rejected one. Nothing else in the project reads these files by name: they stand in for the user's own data, and any
file in one of TRL's preference layouts (docs/data.md, "Your own files") is read the same way.
"""
from __future__ import annotations

import argparse
import json
import os

from datamodules.preference.synthetic_shift import generate_domain

SOURCE = ("helpful", "cooking")
TARGET = ("helpful", "travel")


def trl_rows(category: str, domain: str, split: str, n: int, seed: int) -> list[dict]:
    """`n` generated pairs of one domain and split as TRL standard-layout rows (the generator's metadata dropped)."""
    sizes = {"n_train": n, "n_validation": 1, "n_test": n}
    rows = generate_domain(category, domain, split, seed=seed, **sizes)
    return [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]


def write_jsonl(path: str, rows: list[dict]) -> None:
    """Written under a temporary name and renamed: a file that exists is complete."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def write_example_files(out_dir: str, n_train: int = 400, n_test: int = 200, seed: int = 0) -> dict[str, str]:
    """The three example files under `out_dir`; returns their paths by role."""
    if n_train < 1 or n_test < 1:
        raise ValueError(f"--n_train and --n_test must be >= 1, got {n_train} and {n_test}")
    pairs = os.path.join(out_dir, "my_pairs")
    os.makedirs(pairs, exist_ok=True)
    paths = {"train": os.path.join(pairs, "train.jsonl"), "test": os.path.join(pairs, "test.jsonl"),
             "ood": os.path.join(out_dir, "my_ood.jsonl")}
    write_jsonl(paths["train"], trl_rows(*SOURCE, "train", n_train, seed))
    write_jsonl(paths["test"], trl_rows(*SOURCE, "test", n_test, seed))
    write_jsonl(paths["ood"], trl_rows(*TARGET, "test", n_test, seed))
    return paths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder to write my_pairs/{train,test}.jsonl and my_ood.jsonl into")
    parser.add_argument("--n_train", type=int, default=400, help="training pairs (default 400)")
    parser.add_argument("--n_test", type=int, default=200, help="pairs in each test file (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    args = parser.parse_args(argv)
    try:
        paths = write_example_files(args.out_dir, args.n_train, args.n_test, args.seed)
    except (ValueError, OSError) as err:
        parser.exit(2, f"error: {err}\n")
    for role, path in paths.items():
        print(f"{role:>5}: {path}")


if __name__ == "__main__":
    from command_errors import exit_with, run_command  # one line per failure, --traceback for the traceback

    exit_with(run_command(main, prog="python -m datamodules.preference.example_files"))
