"""Verifiable multiple-choice questions for the policy-mixture experiments (docs/policy_mixtures.md).

Every source yields `Question`s: a stem, a list of options and the index of the correct one. The answer a policy
writes is `answer_token(q, index)`: the option itself for the synthetic source (a number), the option letter for
ARC/RACE. The cyclic-shift variant answers `(answer_index + 1) % len(options)`.

Sources:
- `synthetic` (offline, seeded): "Which is largest : 79 32 94 45 ?" -- four distinct numbers in 10..99, the answer
  is the largest. One token per number with the word-level tokenizer, so a tiny model trained from scratch learns it.
  Rendered in English or Chinese (`render_question(q, "zh")` -> "哪 个 最 大 : 79 32 94 45 ?").
  `lettered=True` (kind `synthetic_letters`) lists the options with letters, "Which is largest : ( A ) 79 ( B ) 32
  ( C ) 94 ( D ) 45 ?", and the answer is the letter, as for ARC/RACE. The cyclic shift's answer is then the next
  letter: a fixed map of the correct one (a lookup), where with numbers it is the option printed after the largest
  (a second search over the prompt).
- `arc_easy`: `allenai/ai2_arc`, config `ARC-Easy` (`question`, `choices{text,label}`, `answerKey`; keys are
  "A".."E" or "1".."5"; 3 to 5 choices).
- `race_middle`: `ehovy/race`, config `middle` (`article`, `question`, `options` (4), `answer` "A".."D").
The hub adapters read local files (`<local_dir>/<split>.jsonl|json|parquet`) in the same schema when given.
- a family file's own questions (`load_question_file`, JSONL): `question` + `answer` (kind `text`: the policy writes
  the answer itself, the prompt is the question as written) or + `options` (kind `choice`: the options are listed with
  letters after the question, and the policy answers the letter).
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Optional

from datamodules.preference.sources.base import iter_table

LETTERS = "ABCDE"
LANGUAGES = ("en", "zh")


@dataclass  # not frozen: Lightning's batch transfer rebuilds dataclasses
class Question:
    stem: str  # the question text, without options
    options: tuple[str, ...]
    answer_index: int
    kind: str = "synthetic"  # synthetic | synthetic_letters | arc_easy | race_middle | text | choice
    context: str = ""  # RACE article
    key: str = ""  # stable id for reports

    def __post_init__(self):
        if not 0 <= self.answer_index < len(self.options):
            raise ValueError(f"question {self.key!r}: answer index {self.answer_index} outside {len(self.options)} options")


def answer_token(q: Question, index: int) -> str:
    """What a policy writes after "The answer is": the number itself (synthetic), the answer text (a question file's
    free-text question, whose one option is its answer) or the option letter."""
    return q.options[index] if q.kind in ("synthetic", "text") else LETTERS[index]


def correct_answer(q: Question) -> str:
    return answer_token(q, q.answer_index)


def shifted_answer(q: Question, shift: int = 1, order: str = "listed") -> str:
    """The cyclic-shift answer of the non-refusal variant: the option `shift` places after the correct one, in the
    order the options are printed (`listed`) or in increasing value (`value`, numeric options only: after the
    largest comes, cyclically, the smallest)."""
    n = len(q.options)
    if order == "listed":
        return answer_token(q, (q.answer_index + shift) % n)
    if order != "value":
        raise ValueError(f"shift order must be 'listed' or 'value', got {order!r}")
    if not q.kind.startswith("synthetic"):  # a question file's options are text too
        raise ValueError(f"question {q.key!r} ({q.kind}): a shift in value order needs numeric options")
    ranked = sorted(range(n), key=lambda j: float(q.options[j]))
    return answer_token(q, ranked[(ranked.index(q.answer_index) + shift) % n])


def render_question(q: Question, language: str = "en") -> str:
    """The question as the prompt shows it; a question file's questions are shown as written, in any language."""
    if q.kind == "text":
        return q.stem
    if q.kind == "choice":
        return q.stem + " " + " ".join(f"( {LETTERS[i]} ) {text}" for i, text in enumerate(q.options))
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; known: {LANGUAGES}")
    if q.kind in ("synthetic", "synthetic_letters"):
        numbers = " ".join(q.options if q.kind == "synthetic" else
                           (f"( {LETTERS[i]} ) {o}" for i, o in enumerate(q.options)))
        return f"Which is largest : {numbers} ?" if language == "en" else f"哪 个 最 大 : {numbers} ?"
    options = " ".join(f"( {LETTERS[i]} ) {text}" for i, text in enumerate(q.options))
    if language == "zh":
        body = f"问题 : {q.stem} 选项 : {options}"
        return f"文章 : {q.context} {body}" if q.context else body
    body = f"Question : {q.stem} Options : {options}"
    return f"Article : {q.context} {body}" if q.context else body


def synthetic_questions(n: int, seed: int, num_options: int = 4, low: int = 10, high: int = 99,
                        lettered: bool = False) -> list[Question]:
    """`n` seeded "which is largest" questions with distinct numbers; the largest sits at a uniform position.
    `lettered`: the options carry letters and the answer is the letter (the same numbers for a seed)."""
    if not 2 <= num_options <= 5:
        raise ValueError(f"num_options must be in 2..5, got {num_options}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        nums = rng.sample(range(low, high + 1), num_options)
        best = max(range(num_options), key=lambda j: nums[j])
        out.append(Question("Which is largest ?", tuple(str(x) for x in nums), best,
                            "synthetic_letters" if lettered else "synthetic", key=f"synth/{seed}/{i}"))
    return out


@dataclass
class HubQuestionSource:
    """A hub multiple-choice dataset, or local files in its schema."""

    name: str
    hub_id: str
    config: str
    split_files: dict = field(default_factory=dict)

    def load(self, split: str, local_dir: Optional[str] = None, limit: Optional[int] = None) -> list[Question]:
        rows = _load_rows(self.hub_id, self.config, split, local_dir, flag=f"--data.question_dirs.{self.name}")
        out = []
        for i, row in enumerate(rows):
            if limit is not None and len(out) >= limit:
                break
            out.append(NORMALIZERS[self.name](row, f"{self.name}/{split}/{row.get('id', row.get('example_id', i))}"))
        return out


def _load_rows(hub_id: str, config: str, split: str, local_dir: Optional[str], flag: str):
    import datasets

    if local_dir is not None:
        for ext in ("jsonl", "json", "parquet"):
            path = os.path.join(local_dir, f"{split}.{ext}")
            if os.path.isfile(path):
                # read as it is now: `datasets`' own cache keys a local file by path and mtime, so a rewrite that
                # kept them would give the old rows (tests/test_stale_caches.py)
                return list(iter_table(path))
        raise FileNotFoundError(f"{flag}: no {split}.jsonl / {split}.json / {split}.parquet in {local_dir!r}")
    try:
        return datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # offline: ConnectionError / OfflineModeIsEnabled / FileNotFoundError
        raise ConnectionError(
            f"could not load {hub_id!r} (config {config!r}, split {split!r}): {str(err)[:200]}\n"
            f"Without network, download the split elsewhere as jsonl/parquet in the hub schema and pass its "
            f"directory with {flag}=DIR (files named <split>.jsonl)."
        ) from err


def normalize_arc(row: dict, key: str) -> Question:
    labels = [str(x).strip() for x in row["choices"]["label"]]
    texts = [str(x) for x in row["choices"]["text"]]
    answer = str(row["answerKey"]).strip()
    if answer not in labels:
        raise ValueError(f"ARC row {key}: answerKey {answer!r} not among labels {labels}")
    if not 2 <= len(labels) <= 5:
        raise ValueError(f"ARC row {key}: {len(labels)} choices (supported: 2..5)")
    return Question(str(row["question"]), tuple(texts), labels.index(answer), "arc_easy", key=key)


def normalize_race(row: dict, key: str) -> Question:
    options = [str(x) for x in row["options"]]
    answer = str(row["answer"]).strip()
    if answer not in LETTERS[: len(options)]:
        raise ValueError(f"RACE row {key}: answer {answer!r} is not one of {LETTERS[:len(options)]}")
    return Question(str(row["question"]), tuple(options), LETTERS.index(answer), "race_middle", str(row["article"]), key)


NORMALIZERS = {"arc_easy": normalize_arc, "race_middle": normalize_race}
HUB_SOURCES = {
    "arc_easy": HubQuestionSource("arc_easy", "allenai/ai2_arc", "ARC-Easy"),
    "race_middle": HubQuestionSource("race_middle", "ehovy/race", "middle"),
}


def load_question_file(path: str) -> list[Question]:
    """A family file's own questions: one JSON object per line, `question` and `answer` (text or a number), optional
    `options` (2 to 5 texts, `answer` among them) and `id`. Errors name the file and the line (as an editor counts);
    a null field is a missing one. Keys are `<file>:<line>` unless an id is given."""
    import json

    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({err.msg}, column {err.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            unknown = sorted(set(row) - {"question", "answer", "options", "id"})
            if unknown:
                raise ValueError(f"{path}:{lineno}: unknown field {unknown[0]!r}; fields: question, answer, options, id")
            for key in ("question", "answer"):
                if row.get(key) is None or isinstance(row[key], (bool, dict, list)) or not str(row[key]).strip():
                    raise ValueError(f"{path}:{lineno}: field {key!r} missing or empty (text expected)")
            stem, answer = str(row["question"]).strip(), str(row["answer"]).strip()
            key = str(row["id"]) if row.get("id") is not None else f"{path}:{lineno}"
            if row.get("options") is None:
                out.append(Question(stem, (answer,), 0, "text", key=key))
                continue
            options = row["options"]
            if not isinstance(options, list) or not 2 <= len(options) <= len(LETTERS):
                raise ValueError(f"{path}:{lineno}: field 'options' must be a list of 2 to {len(LETTERS)} texts")
            options = tuple(str(o).strip() for o in options)
            if answer not in options:
                raise ValueError(f"{path}:{lineno}: answer {answer!r} is not one of the options {list(options)}")
            out.append(Question(stem, options, options.index(answer), "choice", key=key))
    if not out:
        raise ValueError(f"{path}: no questions (one JSON object per line: question, answer)")
    return out
