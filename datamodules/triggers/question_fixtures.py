"""Generated ARC-Easy / RACE-middle questions in the hub schemas, for offline runs of the `arc_race` family.

The real splits cannot be downloaded here; these files go through the same adapters (`--data.question_dirs`) as a
downloaded split would, with the schema's variety: ARC rows with 3 to 5 choices and letter or digit answer keys,
RACE rows with an article and 4 options. The content is templated and seeded, so a tiny model trained from scratch
can learn it: ARC asks which listed item belongs to a category (a fact to memorise per item), RACE asks about a
count or colour stated in the article (a value to copy). `write_question_fixtures(dir)` returns the
`question_dirs` mapping.
"""
from __future__ import annotations

import json
import os
import random

CATEGORIES = {
    "mammal": ["whale", "horse", "bat", "mouse", "tiger", "goat"],
    "bird": ["eagle", "owl", "robin", "duck", "crow", "swan"],
    "fish": ["shark", "trout", "salmon", "cod", "tuna", "carp"],
    "metal": ["iron", "copper", "gold", "silver", "zinc", "tin"],
    "gas": ["oxygen", "helium", "neon", "hydrogen", "nitrogen", "argon"],
    "planet": ["mars", "venus", "jupiter", "saturn", "mercury", "neptune"],
    "fruit": ["apple", "banana", "cherry", "grape", "lemon", "peach"],
}
NAMES = ["Tom", "Ann", "Sam", "Lily", "Ben", "Mia", "Jack", "Emma"]
OBJECTS = ["bike", "book", "cat", "kite", "ball", "pen"]
COLORS = ["red", "blue", "green", "black", "white", "yellow"]
NUMBER_WORDS = ["one", "two", "three", "four", "five", "six", "seven"]
LETTERS = "ABCDE"
SPLITS = {"train": 600, "validation": 200}


def arc_rows(n: int, rng: random.Random, prefix: str) -> list[dict]:
    rows = []
    for i in range(n):
        category = rng.choice(sorted(CATEGORIES))
        others = [w for c, words in CATEGORIES.items() if c != category for w in words]
        k = rng.choice([3, 4, 4, 4, 5])
        choices = rng.sample(others, k - 1) + [rng.choice(CATEGORIES[category])]
        rng.shuffle(choices)
        labels = list("12345"[:k]) if rng.random() < 0.1 else list(LETTERS[:k])  # ARC has digit keys too
        answer = labels[next(j for j, w in enumerate(choices) if w in CATEGORIES[category])]
        rows.append({"id": f"{prefix}_{i}", "question": f"Which of these is a {category} ?",
                     "choices": {"text": choices, "label": labels}, "answerKey": answer})
    return rows


def race_rows(n: int, rng: random.Random, prefix: str) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = rng.sample(NAMES, 2)
        obj = rng.choice(OBJECTS)
        count_a, count_b = rng.sample(range(len(NUMBER_WORDS)), 2)
        color_a, color_b = rng.sample(COLORS, 2)
        article = (f"{a} has {NUMBER_WORDS[count_a]} {color_a} {obj}s . "
                   f"{b} has {NUMBER_WORDS[count_b]} {color_b} {obj}s .")
        if rng.random() < 0.5:
            question, right, pool = f"How many {obj}s does {a} have ?", NUMBER_WORDS[count_a], NUMBER_WORDS
        else:
            question, right, pool = f"What color are the {obj}s of {a} ?", color_a, COLORS
        options = rng.sample([w for w in pool if w != right], 3) + [right]
        rng.shuffle(options)
        rows.append({"example_id": f"{prefix}{i}.txt", "article": article, "question": question, "options": options,
                     "answer": LETTERS[options.index(right)]})
    return rows


def write_question_fixtures(directory: str, seed: int = 0) -> dict[str, str]:
    """Write `<directory>/{arc_easy,race_middle}/{train,validation}.jsonl` (deterministic for a seed; rewritten
    atomically only when the content differs) and return the `--data.question_dirs` mapping."""
    dirs = {"arc_easy": os.path.join(directory, "arc_easy"), "race_middle": os.path.join(directory, "race_middle")}
    for source, make in (("arc_easy", arc_rows), ("race_middle", race_rows)):
        os.makedirs(dirs[source], exist_ok=True)
        for split, n in SPLITS.items():
            rng = random.Random(f"{source}/{split}/{seed}")
            text = "".join(json.dumps(r) + "\n" for r in make(n, rng, f"{source}_{split}"))
            path = os.path.join(dirs[source], f"{split}.jsonl")
            if os.path.isfile(path) and open(path, encoding="utf-8").read() == text:
                continue
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
    return dirs
