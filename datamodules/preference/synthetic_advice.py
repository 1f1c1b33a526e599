"""Seeded generator of the "advice" preference benchmark (docs/hub_benchmarks.md). Pure Python, no torch.

A second benchmark of the shipped generator's design (`synthetic_shift`), with a lexicon, topics and cue of its own
(`synthetic_advice_lexicon`): one source domain and three shifted targets share one rule that needs the prompt,
while a surface cue on exactly one response per pair correlates with the preference at a per-domain rate.

    rule  the chosen response answers the request about the prompt's subject; the rejected one answers the same
          kind of request about another subject of the same domain (equally fluent and on-domain), so without the
          prompt only the cue is informative
    cue   "authority": an opening attribution ("According to experts:") and/or a closing citation
          ("(Source: a peer reviewed study)"), each form with probability 1/3
    rates P(cue on the chosen response): gardening 0.85 (source), fitness 0.5, music 0.15, pets: no cue

A request (the prompt without its lead) belongs to one split, by a hash of its text, and each prompt is used by one
pair only: no request is shared by two splits, and a validation set carved from train shares no prompt with it.
"""
from __future__ import annotations

import functools
import hashlib
import random
import re
from typing import Optional

from datamodules.preference import synthetic_advice_lexicon as lex
from datamodules.preference.synthetic_shift import N_BUCKETS, SPLIT_BUCKETS, SPLITS, split_words
from datamodules.preference.synthetic_shift import _strings as lexicon_strings  # one walker for both lexicons

DOMAINS = ("gardening", "fitness", "music", "pets")
SOURCE_DOMAIN = "gardening"
# P(the cue sits on the chosen response); None = the target where neither response carries it.
DEFAULT_CUE_RATES: dict[str, Optional[float]] = {"gardening": 0.85, "fitness": 0.5, "music": 0.15, "pets": None}
CUE_KIND = "authority"
_MAX_MISSES = 5000  # consecutive draws without a new prompt before giving up


def has_cue(text: str) -> bool:
    """Whether a response carries the authority cue, read from the text alone."""
    return any(text.startswith(o + " ") for o in lex.CUE_OPENERS) or any(
        text.endswith(" " + c) for c in lex.CUE_CLOSERS)


def mentions(text: str, subject: str) -> bool:
    """Whether `text` names `subject` (whole words, any case)."""
    return re.search(rf"(?<!\w){re.escape(subject.lower())}(?!\w)", text.lower()) is not None


def subjects_in(text: str, domain: str) -> list[str]:
    """The subjects of `domain` that `text` names (one for every prompt and response: subject words are unique)."""
    return [s for s in lex.DOMAINS[domain]["subjects"] if mentions(text, s)]


def request_split(request: str) -> str:
    """The split that owns a request (the prompt without its lead): sha1 of the text mod 10 -> 0-6 train,
    7 validation, 8-9 test, independent of seeds and options."""
    bucket = int(hashlib.sha1(request.encode("utf-8")).hexdigest()[:8], 16) % N_BUCKETS
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


@functools.lru_cache(maxsize=1)
def _vocabulary() -> tuple[str, ...]:
    # synthetic_shift's own walker: its source is part of the shipped benchmark's data identity (a stage's
    # identity holds the generator's code hash), so it is imported, not refactored into a shared helper
    words: set[str] = set()
    for text in lexicon_strings([v for k, v in vars(lex).items() if k.isupper()]):
        words.update(split_words(re.sub(r"\{\w+\}", " ", text)))
    return tuple(sorted(words))


def advice_vocabulary() -> list[str]:
    """Every word (under `synthetic_shift.split_words`) the generator and its hub records can emit: a closed
    vocabulary for a word-level tokenizer, as `synthetic_vocabulary()` is for the shipped benchmark."""
    return list(_vocabulary())


def generate_domain(domain: str, split: str, n: int, seed: int = 0, cue_rate: Optional[float] = None,
                    cues: bool = True) -> list[dict]:
    """`n` pairs of one split of one domain, deterministic given the arguments; the first k rows do not depend on n.

    Each row: index, domain, split, prompt (lead and request as one string), lead, request, chosen, rejected, and
    hidden metadata: question (the request type), subject, other_subject (the rejected response's), cue_rate (as
    generated, None without cue) and cue_on_chosen (True / False, None without cue). Changing only `cue_rate`
    keeps every text apart from where the cue sits.

    Args:
        domain: one of `DOMAINS`.
        split: "train", "validation" or "test".
        n: pairs to generate (distinct prompts).
        seed: base seed; each (domain, split) draws from its own sub-seed.
        cue_rate: P(the chosen response carries the cue) in [0, 1]; None keeps the domain's default
            (`DEFAULT_CUE_RATES`); a number also puts cues into the no-cue target.
        cues: False puts the cue on neither response.
    """
    if domain not in lex.DOMAINS:
        raise ValueError(f"unknown advice domain {domain!r}; known domains: {list(DOMAINS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {list(SPLITS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if cue_rate is not None and (isinstance(cue_rate, bool) or not isinstance(cue_rate, (int, float))
                                 or not 0 <= cue_rate <= 1):
        raise ValueError(f"cue_rate must be a number in [0, 1] or None, got {cue_rate!r}")
    rate = None if not cues else (float(cue_rate) if cue_rate is not None else DEFAULT_CUE_RATES[domain])
    table = lex.DOMAINS[domain]
    # str seeds are hashed with sha512 by `random.Random`: stable across processes and Python versions.
    text_rng = random.Random(f"advice/{domain}/{split}/{seed}/text")
    cue_rng = random.Random(f"advice/{domain}/{split}/{seed}/cue")
    rows: list[dict] = []
    used: set[str] = set()
    misses = 0
    while len(rows) < n:
        if misses > _MAX_MISSES:
            raise ValueError(f"advice/{domain}: no new {split} prompt in {_MAX_MISSES} draws after {len(rows)} "
                             f"pairs; lower n (got {n})")
        misses += 1
        question = text_rng.choice(sorted(table["questions"]))
        subject = text_rng.choice(table["subjects"])
        lead = text_rng.choice(lex.SHARED_LEADS + table["leads"])
        request = text_rng.choice(table["questions"][question]["requests"]).format(s=subject)
        prompt = f"{lead} {request}" if lead else request
        if request_split(request) != split or prompt in used:
            continue
        other = text_rng.choice([s for s in table["subjects"] if s != subject])
        good = _answer(text_rng, table, question, subject)
        bad = _answer(text_rng, table, question, other)
        used.add(prompt)
        misses = 0
        rows.append(_finish_row(len(rows), domain, split, lead, request, prompt, question, subject, other,
                                good, bad, rate, cue_rng))
    return rows


def _answer(rng: random.Random, table: dict, question: str, subject: str) -> str:
    a1, a2 = rng.sample(table["questions"][question]["advice"], 2)
    return _sentence_case(rng.choice(table["answers"]).format(s=subject, a1=a1, a2=a2))


def _finish_row(index: int, domain: str, split: str, lead: str, request: str, prompt: str, question: str,
                subject: str, other: str, good: str, bad: str, rate: Optional[float], rng: random.Random) -> dict:
    # The same number of draws whatever the rate, so a rate change moves cues and nothing else.
    u = rng.random()
    cued_good, cued_bad = _with_cue(good, rng), _with_cue(bad, rng)
    on_chosen = None if rate is None else u < rate
    return {"index": index, "domain": domain, "split": split, "prompt": prompt, "lead": lead, "request": request,
            "chosen": cued_good if on_chosen is True else good, "rejected": cued_bad if on_chosen is False else bad,
            "question": question, "subject": subject, "other_subject": other, "cue_rate": rate,
            "cue_on_chosen": on_chosen}


def _with_cue(text: str, rng: random.Random) -> str:
    form = rng.randrange(3)  # 0: opener, 1: closer, 2: both
    opener, closer = rng.choice(lex.CUE_OPENERS), rng.choice(lex.CUE_CLOSERS)
    return " ".join(([opener] if form != 1 else []) + [text] + ([closer] if form != 0 else []))


def _sentence_case(text: str) -> str:
    return re.sub(r"(^|[.?]\s+)([a-z])", lambda m: m.group(1) + m.group(2).upper(), text)
