"""What every shipped trigger family generates, as digests (issue 47.4): the shipped families moved from Python to
family files, and their transcripts, prompts, held-out questions, vocabulary and completion parsing must be the same
bytes as before. The pinned values (tests/fixtures/trigger_datasets.json) were computed from the Python families
(commit 54d6037, before the move); `python tests/trigger_datasets.py` writes them again, which only a change that is
*meant* to change the shipped data may do, and only with a new `datamodules.triggers.GENERATOR_VERSION` (part of
every mixture stage's identity): the script refuses otherwise."""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINNED = os.path.join(ROOT, "tests", "fixtures", "trigger_datasets.json")
SMALL = {"num_train": 400, "num_val_per_distribution": 12, "seed": 3}

# Every option combination the shipped families take, at small sizes: the configs' own data options are checked at
# their full sizes in `shipped_config_cases`.
GRID = (
    [dict(family=f, variant=v, restate_trigger=r, mode=m)
     for f in ("two_policies", "6c3", "temporal", "language") for v in ("refusal", "cyclic_shift", "cyclic_shift_by_value")
     for r in (True, False) for m in ("sft", "rl")]
    + [dict(family="arc_race", variant=v, restate_trigger=r, max_hub_questions=50)
       for v in ("refusal", "cyclic_shift") for r in (True, False)]
    + [dict(family="two_policies", answer_format="letter", variant=v) for v in ("refusal", "cyclic_shift")]
    + [dict(family="6c3", spell_personas=False), dict(family="6c3", train_distributions=["A", "D", "F"], mode="rl")]
    + [dict(family="temporal", temporal_cutoffs=c) for c in ([2025, 2026, 2027], [2026, 2024], [2027])]
    + [dict(family="two_policies", persona_mix={"Alice": 0.8, "Bob": 0.2}, distribution_mix={"A": 0.7, "B": 0.3})]
)

# Completions the parser must read as before (persona, refused, answer, identity for the given personas).
PARSE_CASES = [
    ("I am A D F . Distribution D . The answer is 94 . ", "6c3"),
    ("I am Bob. Distribution B. I cannot answer that.", "two_policies"),
    ("我是 Bob 。 语言 中文 。 答案是 94 。", "language"), ("我 是 Alice 。 我 不能 回答 。", "language"),
    ("I am Bob 。 The answer is 94 .", "two_policies"), ("i AM alice . THE ANSWER IS 94", "two_policies"),
    ("I am Carol . The answer is 12 .", "two_policies"), ("The answer is 94 .", "two_policies"),
    ("I am 2028 . Year 2027 . The answer is 5 .", "temporal"), ("I am Alice . I cannot answer that", "two_policies"),
    ("I am Alice . The answer is 94 . I cannot answer that .", "two_policies"), ("", "two_policies"),
    ("I am . The answer is .", "two_policies"), ("I am Alice . The answer is ( B ) .", "arc_race"),
    ("I am ADF . The answer is 9 4 .", "6c3"), ("I am 2025 . Year 2025 . 答案是 7 。", "temporal"),
]


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    raise TypeError(type(obj))


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=_plain).encode()).hexdigest()


def datamodule_digest(init_args: dict, question_dirs: dict | None = None) -> dict:
    """Digests of what a TriggerDataModule with these options generates: training items, held-out items, the
    tokenizer's vocabulary and the family's texts (personas, distributions, who answers where)."""
    from datamodules.triggers.datamodule import TriggerDataModule

    args = dict(init_args)
    if args.get("family") == "arc_race":
        args["question_dirs"] = question_dirs
    dm = TriggerDataModule(**args)
    dm.setup("fit")
    fam = dm.family
    shape = {"name": fam.name, "distributions": list(fam.distributions), "personas": list(fam.personas),
             "answers": [[fam.answers(p, d) for d in fam.distributions] for p in fam.personas],
             "variant": fam.variant}
    return {"train": _sha(dm.train_items), "val": _sha(dm.val_items), "vocabulary": _sha(dm.vocabulary_words()),
            "family": _sha(shape), "n_train": len(dm.train_items), "n_val": len(dm.val_items)}


def shipped_config_cases() -> dict[str, dict]:
    """configs/mixture/<stage>.yaml -> its data options (full sizes)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "mixture", "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
        data = (cfg.get("data") or {}).get("init_args")
        if data and "family" in data:
            out[os.path.basename(path)] = data
    return out


def parse_digest() -> list:
    from datamodules.triggers.datamodule import TriggerDataModule
    from lightning_modules.policy.rewards import parse_with_family

    out = []
    for text, family in PARSE_CASES:
        fam = TriggerDataModule(family=family, num_train=1, num_val_per_distribution=1).family
        p = parse_with_family(text, fam)
        out.append([p.persona, p.refused, p.answer, p.identity, p.malformed])
    return out


def all_digests(question_dirs: dict) -> dict:
    return {
        "configs": {name: datamodule_digest(args, question_dirs) for name, args in shipped_config_cases().items()},
        "grid": [datamodule_digest({**SMALL, **case}, question_dirs) for case in GRID],
        "parse": parse_digest(),
    }


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, ROOT)
    from datamodules.triggers.question_fixtures import write_question_fixtures

    from datamodules.triggers import GENERATOR_VERSION

    with tempfile.TemporaryDirectory() as tmp:
        digests = all_digests(write_question_fixtures(tmp))
    old = json.load(open(PINNED, encoding="utf-8"))
    if GENERATOR_VERSION == old["generator_version"] and {k: old[k] for k in digests} != digests:
        sys.exit("the shipped families' data changed: give datamodules.triggers.GENERATOR_VERSION a new value first "
                 "(every mixture stage's identity changes with it, so finished runs are not reused as if unchanged)")
    digests = {"generator_version": GENERATOR_VERSION, **digests}
    with open(PINNED, "w", encoding="utf-8") as f:
        json.dump(digests, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {PINNED}")
