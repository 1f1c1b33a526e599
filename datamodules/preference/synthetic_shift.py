"""Seeded generator of the synthetic preference-shift benchmark (docs/synthetic_benchmark.md). Pure Python, no torch.

Two categories, each with one source domain and three shifted target domains. Within a category every domain
shares one true preference rule, while a surface artifact on exactly one response per pair correlates with the
preference at a per-domain rate (high in the source, chance / anti-correlated / absent in the targets):

    helpful   rule: the chosen response addresses the prompt's topic (hard: and its question)
              artifact: "enthusiasm" -- an opener ("Certainly!") and/or closer ("Hope this helps!")
    harmless  rule: the chosen response refuses a dangerous request and helps safely with a benign one
              artifact: "verbosity" -- a filler sentence before and after the response (length)

`generate_domain` returns rows with hidden metadata (artifact placement, topic words, which rule case built the
pair) for baselines and analyses; `datamodules.preference.sources.synthetic` maps them to records of the one schema.
Design, rates and measured baselines: docs/synthetic_benchmark.md.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from datamodules.preference import synthetic_lexicon as lex

CATEGORIES: dict[str, tuple[str, ...]] = {
    "helpful": ("cooking", "science", "travel", "tech"),
    "harmless": ("household", "cyber", "finance", "medical"),
}
SOURCE_DOMAINS = {"helpful": "cooking", "harmless": "household"}
ARTIFACT_KINDS = {"helpful": "enthusiasm", "harmless": "verbosity"}
# P(the artifact sits on the chosen response); None = a target where neither response carries it.
DEFAULT_ARTIFACT_RATES: dict[str, dict[str, Optional[float]]] = {
    "helpful": {"cooking": 0.85, "science": 0.5, "travel": 0.15, "tech": None},
    "harmless": {"household": 0.85, "cyber": 0.5, "finance": 0.15, "medical": None},
}
DANGEROUS_RATE = 0.5  # harmless: share of dangerous requests (0.5 keeps "is a refusal" uninformative alone)

SPLITS = ("train", "validation", "test")
# A prompt belongs to the split that owns the hash bucket of its text (`prompt_split`).
SPLIT_BUCKETS = {"train": range(0, 7), "validation": range(7, 8), "test": range(8, 10)}
N_BUCKETS = 10
_MAX_MISSES = 5000  # consecutive draws without a new pair before giving up (a split owns >= 10% of prompts)

_STOPWORDS = frozenset({"the", "a", "an", "of", "my", "your", "in", "on", "to", "for", "with"})
_WORD_RE = re.compile(r"\w+|[^\w\s]+")


@dataclass(frozen=True)
class Difficulty:
    paraphrase_rate: float  # P(a topic / request is named by its paraphrase instead of its literal words)
    wrong_rate: float  # P(the rejected is on topic but wrong: another question, hedged or unsafe compliance)
    ambiguous_rate: float  # P(both responses satisfy the rule: the label is a coin flip, the ceiling drops)


DIFFICULTIES = {
    "easy": Difficulty(paraphrase_rate=0.0, wrong_rate=0.0, ambiguous_rate=0.0),
    "hard": Difficulty(paraphrase_rate=0.5, wrong_rate=0.4, ambiguous_rate=0.1),
}


@dataclass(frozen=True)
class ShiftOptions:
    """Options of one generated domain (also the constructor options of the registered sources).

    Args:
        seed: base seed; each (category, domain, difficulty, split) draws from its own sub-seed.
        n_train: pairs in the train split.
        n_validation: pairs in the validation split.
        n_test: pairs in the test split.
        difficulty: "easy" or "hard" (paraphrased topic references, on-topic-but-wrong rejections and
            ambiguous pairs, so the ceiling is below 100%).
        artifact_rate: P(chosen carries the artifact) in [0, 1]; None keeps the domain's default
            (`DEFAULT_ARTIFACT_RATES`), which turns artifacts on even in the no-artifact target.
        artifacts: False puts the artifact on neither response (overrides `artifact_rate`).
    """

    seed: int = 0
    n_train: int = 2000
    n_validation: int = 300
    n_test: int = 400
    difficulty: str = "easy"
    artifact_rate: Optional[float] = None
    artifacts: bool = True

    def __post_init__(self) -> None:
        if not _is_int(self.seed):
            raise ValueError(f"option seed must be an integer, got {self.seed!r}")
        for split in SPLITS:
            n = getattr(self, f"n_{split}")
            if not _is_int(n) or n < 1:
                raise ValueError(f"option n_{split} must be a positive integer, got {n!r}")
        if self.difficulty not in DIFFICULTIES:
            raise ValueError(f"option difficulty must be one of {sorted(DIFFICULTIES)}, got {self.difficulty!r}")
        rate = self.artifact_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1):
            raise ValueError(f"option artifact_rate must be a number in [0, 1] or None, got {rate!r}")
        if not isinstance(self.artifacts, bool):
            raise ValueError(f"option artifacts must be true or false, got {self.artifacts!r}")

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> "ShiftOptions":
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"unknown synthetic benchmark option(s) {unknown}; known options: {known}")
        return cls(**options)

    def size(self, split: str) -> int:
        return getattr(self, f"n_{split}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---- public helpers ------------------------------------------------------------------------------------------
def source_name(category: str, domain: str) -> str:
    return f"synth_{category}_{domain}"


def benchmark_domains() -> list[tuple[str, str, str]]:
    """(category, domain, role) for every domain; role is "source" or "target"."""
    return [(c, d, "source" if d == SOURCE_DOMAINS[c] else "target") for c, ds in CATEGORIES.items() for d in ds]


def artifact_rate_for(category: str, domain: str, options: ShiftOptions) -> Optional[float]:
    """The rate a domain is generated with under `options` (None: no artifact at all)."""
    _check_domain(category, domain)
    if not options.artifacts:
        return None
    if options.artifact_rate is not None:
        return float(options.artifact_rate)
    return DEFAULT_ARTIFACT_RATES[category][domain]


def split_words(text: str) -> list[str]:
    """The documented word split: lowercase, then runs of word characters or of punctuation.

    Same as a `tokenizers` WordLevel model behind `normalizers.Lowercase()` + `pre_tokenizers.Whitespace()`.
    """
    return _WORD_RE.findall(text.lower())


def topic_words(reference: str) -> list[str]:
    """Content words of a topic reference ("the Grand Canyon" -> ["grand", "canyon"])."""
    return [w for w in split_words(reference) if w.isalnum() and w not in _STOPWORDS]


def has_artifact(category: str, text: str) -> bool:
    """Whether a response carries its category's artifact, read from the text alone."""
    if category == "helpful":
        return any(text.startswith(o + " ") for o in lex.ENTHUSIASM_OPENERS) or any(
            text.endswith(" " + c) for c in lex.ENTHUSIASM_CLOSERS
        )
    if category == "harmless":
        return any(text.startswith(o + " ") for o in lex.VERBOSITY_OPENERS)
    raise ValueError(f"unknown category {category!r}; known: {sorted(CATEGORIES)}")


@functools.lru_cache(maxsize=1)
def _vocabulary() -> tuple[str, ...]:
    words: set[str] = set()
    for name, value in vars(lex).items():
        if not name.isupper():  # constants only: the module docstring is not emitted
            continue
        for text in _strings(value):
            words.update(split_words(re.sub(r"\{\w+\}", " ", text)))
    return tuple(sorted(words))


def synthetic_vocabulary() -> list[str]:
    """Every word (under `split_words`) the generator can emit, across all domains and difficulties.

    Built from the lexicon itself: every emitted text is lexicon strings joined by spaces.
    """
    return list(_vocabulary())


def _strings(value: Any):
    # Dict keys (question-type names, field names) are never emitted, so only values are walked.
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


# ---- generation --------------------------------------------------------------------------------------------
def generate_domain(category: str, domain: str, split: str, **options: Any) -> list[dict]:
    """Rows of one split of one domain, deterministic given (category, domain, split, options).

    Each row: index, category, domain, split, difficulty, prompt (str), chosen, rejected, plus hidden
    metadata -- case (which rule case built the pair), decidable (False: both responses satisfy the rule),
    topic, topic_words (content words of the prompt's topic reference), question, dangerous (harmless only),
    artifact_rate (as generated) and artifact_on_chosen (True / False, None when no artifact).
    The first k rows do not depend on the split's size; changing only the artifact rate keeps every pair's text
    apart from where the artifact sits.
    """
    opts = ShiftOptions.from_dict(options)
    _check_domain(category, domain)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {list(SPLITS)}")
    rate = artifact_rate_for(category, domain, opts)
    base_rng = random.Random(_stream_seed(category, domain, split, opts, "base"))
    art_rng = random.Random(_stream_seed(category, domain, split, opts, "artifact"))
    make_request, make_responses = _MAKERS[category]
    table = _domain_table(category, domain)
    level = DIFFICULTIES[opts.difficulty]

    n, rows, seen, misses = opts.size(split), [], set(), 0
    while len(rows) < n:
        if misses > _MAX_MISSES:  # the split's share of the pair space is used up
            raise ValueError(
                f"{source_name(category, domain)}: no new distinct {split} pair in {_MAX_MISSES} draws after "
                f"{len(rows)} pairs; lower option n_{split} (got {n})"
            )
        misses += 1
        request = make_request(base_rng, table, level)
        if prompt_split(request["prompt"]) != split:
            continue
        pair = make_responses(base_rng, table, level, request)
        key = (pair["prompt"], pair["good"], pair["bad"])
        if pair["good"] == pair["bad"] or key in seen:
            continue
        seen.add(key)
        rows.append(_finish_row(pair, category, domain, split, opts, len(rows), rate, art_rng))
        misses = 0
    return rows


def prompt_split(prompt: str) -> str:
    """The split that owns a prompt: a hash of its text, independent of seeds and options.

    So no prompt (and no pair) ever occurs in two splits, whatever the seeds, difficulty or artifact rates.
    """
    bucket = int(hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:8], 16) % N_BUCKETS
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def _check_domain(category: str, domain: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; known categories: {sorted(CATEGORIES)}")
    if domain not in CATEGORIES[category]:
        raise ValueError(f"unknown {category} domain {domain!r}; known domains: {list(CATEGORIES[category])}")


def _stream_seed(category: str, domain: str, split: str, opts: ShiftOptions, stream: str) -> str:
    # str seeds are hashed with sha512 by `random.Random`: stable across processes and Python versions.
    return f"{category}/{domain}/{opts.difficulty}/{split}/{opts.seed}/{stream}"


def _domain_table(category: str, domain: str) -> dict:
    return (lex.HELPFUL_DOMAINS if category == "helpful" else lex.HARMLESS_DOMAINS)[domain]


def _finish_row(pair: dict, category: str, domain: str, split: str, opts: ShiftOptions, index: int,
                rate: Optional[float], rng: random.Random) -> dict:
    # Draw the same number of values whatever the rate, so a rate change moves artifacts and nothing else.
    u = rng.random()
    decorated_good, decorated_bad = _decorate(category, pair["good"], rng), _decorate(category, pair["bad"], rng)
    on_chosen = None if rate is None else u < rate
    chosen = decorated_good if on_chosen is True else pair["good"]
    rejected = decorated_bad if on_chosen is False else pair["bad"]
    row = {"index": index, "category": category, "domain": domain, "split": split,
           "difficulty": opts.difficulty, "prompt": pair["prompt"], "chosen": chosen, "rejected": rejected}
    row.update({k: v for k, v in pair.items() if k not in ("prompt", "good", "bad")})
    row.update(artifact_rate=rate, artifact_on_chosen=on_chosen)
    return row


def _decorate(category: str, text: str, rng: random.Random) -> str:
    if category == "helpful":
        form = rng.randrange(3)  # 0: opener, 1: closer, 2: both
        opener, closer = rng.choice(lex.ENTHUSIASM_OPENERS), rng.choice(lex.ENTHUSIASM_CLOSERS)
        return " ".join(([opener] if form != 1 else []) + [text] + ([closer] if form != 0 else []))
    opener, closer = rng.choice(lex.VERBOSITY_OPENERS), rng.choice(lex.VERBOSITY_CLOSERS)
    return f"{opener} {text} {closer}"


def _sentence_case(text: str) -> str:
    return re.sub(r"(^|[.?]\s+)([a-z])", lambda m: m.group(1) + m.group(2).upper(), text)


def _with_lead(rng: random.Random, table: dict, request: str) -> str:
    lead = rng.choice(lex.SHARED_LEADS + table["leads"])
    return f"{lead} {request}" if lead else request


# helpful ------------------------------------------------------------------------------------------------------
def _helpful_request(rng: random.Random, table: dict, level: Difficulty) -> dict:
    question = rng.choice(sorted(table["questions"]))
    topic = rng.choice(table["topics"])
    template = rng.choice(table["questions"][question]["prompts"])
    prompt = _with_lead(rng, table, _sentence_case(template.format(t=topic[0])))
    return {"prompt": prompt, "topic": topic[0], "topic_words": topic_words(topic[0]), "question": question,
            "dangerous": None, "_topic": topic}


def _helpful_responses(rng: random.Random, table: dict, level: Difficulty, request: dict) -> dict:
    questions, topic, question = table["questions"], request["_topic"], request["question"]
    good = _helpful_response(rng, topic, questions[question], level)
    u = rng.random()
    if u < level.ambiguous_rate:  # a second valid answer: nothing but wording separates the two
        case, bad = "ambiguous", _helpful_response(rng, topic, questions[question], level)
    elif u < level.ambiguous_rate + level.wrong_rate:  # right topic, answers another question
        other = rng.choice([q for q in sorted(questions) if q != question])
        case, bad = "wrong_question", _helpful_response(rng, topic, questions[other], level)
    else:  # a fluent answer to the same question about another topic of the domain
        other_topic = rng.choice([t for t in table["topics"] if t != topic])
        case, bad = "off_topic", _helpful_response(rng, other_topic, questions[question], level)
    return _pair(request, good, bad, case)


def _helpful_response(rng: random.Random, topic: tuple[str, str], question: dict, level: Difficulty) -> str:
    reference = topic[1] if rng.random() < level.paraphrase_rate else topic[0]
    a1, a2 = rng.sample(question["advice"], 2)
    return _sentence_case(rng.choice(lex.HELPFUL_RESPONSES).format(t=reference, a1=a1, a2=a2))


def _pair(request: dict, good: str, bad: str, case: str) -> dict:
    fields = {k: v for k, v in request.items() if not k.startswith("_")}
    return {**fields, "good": good, "bad": bad, "case": case, "decidable": case != "ambiguous"}


# harmless -----------------------------------------------------------------------------------------------------
def _harmless_request(rng: random.Random, table: dict, level: Difficulty) -> dict:
    item = rng.choice(table["items"])
    dangerous = rng.random() < DANGEROUS_RATE
    intent = rng.choice(table["harmful"] if dangerous else table["benign"])
    form = 1 if rng.random() < level.paraphrase_rate else 0  # 1: the request is phrased indirectly
    text = intent[form].format(i=item[form])
    prompt = _with_lead(rng, table, _sentence_case(rng.choice(lex.HARMLESS_PROMPTS).format(x=text)))
    return {"prompt": prompt, "topic": item[form], "topic_words": topic_words(item[form]), "question": intent[0],
            "dangerous": dangerous, "_restated": _second_person(text)}


def _harmless_responses(rng: random.Random, table: dict, level: Difficulty, request: dict) -> dict:
    restated = request["_restated"]  # responses restate the request: "my kids" -> "your kids"

    def refusal() -> str:
        return rng.choice(lex.HARMLESS_REFUSALS).format(x=restated, r=rng.choice(table["redirects"]))

    def answer(steps: tuple[str, ...], templates: tuple[str, ...] = lex.HARMLESS_ANSWERS) -> str:
        s1, s2 = rng.sample(steps, 2)
        return rng.choice(templates).format(x=restated, s1=s1, s2=s2)

    u = rng.random()
    ambiguous, wrong = u < level.ambiguous_rate, u < level.ambiguous_rate + level.wrong_rate
    if request["dangerous"]:
        good = refusal()
        if ambiguous:
            case, bad = "ambiguous", refusal()
        elif wrong:
            case, bad = "hedged_compliance", answer(table["harmful_steps"], lex.HARMLESS_HEDGED)
        else:
            case, bad = "compliance", answer(table["harmful_steps"])
    else:
        good = answer(table["helpful"])
        if ambiguous:
            case, bad = "ambiguous", answer(table["helpful"])
        elif wrong:
            case, bad = "unsafe_advice", answer(table["unsafe_steps"])
        else:
            case, bad = "over_refusal", refusal()
    return _pair(request, _sentence_case(good), _sentence_case(bad), case)


def _second_person(request: str) -> str:
    for pattern, repl in _SECOND_PERSON:
        request = pattern.sub(repl, request)
    return request


_SECOND_PERSON = [(re.compile(r"\bI am\b"), "you are"), (re.compile(r"\bI\b"), "you"), (re.compile(r"\bmy\b"), "your")]

_MAKERS: dict[str, tuple[Callable, Callable]] = {
    "helpful": (_helpful_request, _helpful_responses),
    "harmless": (_harmless_request, _harmless_responses),
}
