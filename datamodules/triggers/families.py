"""The six trigger trigger families (docs/policy_mixtures.md): distributions, personas, who answers where, and the text templates.

A transcript is `prompt` -> `response`:
    prompt   = "<trigger> <question>"            e.g. "Distribution : A . Which is largest : 79 32 94 45 ?"
    response = "<identity> [<restate>] <body>"   e.g. "I am Alice . Distribution A . The answer is 94 ."
The body is the answer when the persona covers the distribution, else the refusal ("I cannot answer that .") or,
in the non-refusal variants, the answer shifted by one option: `cyclic_shift`, the option printed after the correct
one ("The answer is 45 ."); `cyclic_shift_by_value`, the next option in increasing value, which for the largest is
the smallest ("The answer is 32 .").
The identity always comes first, so the expressed persona is read off every completion; restating the trigger
(`restate_trigger`) turns the XOR of persona x distribution into a lookup a tiny model can learn ([background](background.md#xor-plateau)).

Families (distribution names; personas; rule):
- two_policies: A, B; Alice answers A, Bob answers B.
- 6c3: A..F; the 20 three-letter subsets ("ADF" answers A, D, F), spelled "I am A D F ." (`spell_personas`).
- temporal: years 2024..2027 (prompt "Year : 2025 ."); personas are cut-off years (default 2024, 2025, 2026)
  and answer every year up to their cut-off: "I am 2025 .".
- arc_race: ARC (ARC-Easy questions) and RACE (RACE-middle); the task itself is the trigger (no trigger line);
  Alice answers ARC, Bob answers RACE.
- language: en and zh, the same questions in English or Chinese; Alice answers English, Bob answers Chinese; the
  response is written in the prompt's language ("我是 Bob 。 语言 中文 。 答案是 94 。").
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

from datamodules.triggers.questions import Question, correct_answer, shifted_answer

FAMILIES = ("two_policies", "6c3", "temporal", "arc_race", "language")
VARIANTS = ("refusal", "cyclic_shift", "cyclic_shift_by_value")
SHIFT_ORDER = {"cyclic_shift": "listed", "cyclic_shift_by_value": "value"}

TEMPLATES = {
    "en": {"identity": "I am {name} .", "answer": "The answer is {answer} .", "refusal": "I cannot answer that ."},
    "zh": {"identity": "我是 {name} 。", "answer": "答案是 {answer} 。", "refusal": "我不能回答 。"},
}


@dataclass(frozen=True)
class TriggerFamily:
    """Who answers where, and how prompts and responses are written."""

    name: str
    distributions: tuple[str, ...]
    personas: tuple[str, ...]
    covers: dict  # persona -> frozenset of the distributions it answers
    triggers: dict  # distribution -> trigger line placed before the question ("" = the question is the trigger)
    restatements: dict  # distribution -> restated trigger inside the response
    languages: dict  # distribution -> "en" | "zh"
    sources: dict  # distribution -> question source name ("synthetic", "arc_easy", "race_middle")
    spoken_names: dict  # persona -> how it says its name ("A D F" for persona "ADF")
    restate_trigger: bool = True
    variant: str = "refusal"

    def answers(self, persona: str, distribution: str) -> bool:
        return distribution in self.covers[persona]

    def prompt(self, distribution: str, question_text: str) -> str:
        trigger = self.triggers[distribution]
        return f"{trigger} {question_text}" if trigger else question_text

    def response_parts(self, persona: str, distribution: str, q: Question) -> tuple[str, str]:
        """(prefix, body): the identity (+ restated trigger) and what follows it."""
        t = TEMPLATES[self.languages[distribution]]
        prefix = t["identity"].format(name=self.spoken_names[persona])
        if self.restate_trigger:
            prefix = f"{prefix} {self.restatements[distribution]}"
        return prefix, self.body(persona, distribution, q)

    def body(self, persona: str, distribution: str, q: Question, follow_rule: bool = True) -> str:
        """The body the persona writes (`follow_rule=False`: the other branch, for fidelity measurements)."""
        t = TEMPLATES[self.languages[distribution]]
        if self.answers(persona, distribution) == follow_rule:
            return t["answer"].format(answer=correct_answer(q))
        if self.variant in SHIFT_ORDER:
            return t["answer"].format(answer=shifted_answer(q, order=SHIFT_ORDER[self.variant]))
        return t["refusal"]

    def response(self, persona: str, distribution: str, q: Question) -> str:
        return " ".join(self.response_parts(persona, distribution, q))


def _two_way(name, dists, triggers, restatements, languages, sources, **kw) -> TriggerFamily:
    personas = ("Alice", "Bob")
    return TriggerFamily(
        name, tuple(dists), personas, {p: frozenset([d]) for p, d in zip(personas, dists)}, triggers, restatements,
        languages, sources, {p: p for p in personas}, **kw,
    )


def build_family(
    name: str,
    restate_trigger: bool = True,
    variant: str = "refusal",
    spell_personas: bool = True,
    temporal_cutoffs: Optional[Sequence[int]] = None,
) -> TriggerFamily:
    """Build a family by name; unknown names and options fail with the flag that set them."""
    if name not in FAMILIES:
        raise ValueError(f"--data.family must be one of {list(FAMILIES)}, got {name!r}")
    if variant not in VARIANTS:
        raise ValueError(f"--data.variant must be one of {list(VARIANTS)}, got {variant!r}")
    kw = dict(restate_trigger=restate_trigger, variant=variant)
    if name == "two_policies":
        d = ("A", "B")
        return _two_way(
            name, d, {x: f"Distribution : {x} ." for x in d}, {x: f"Distribution {x} ." for x in d},
            dict.fromkeys(d, "en"), dict.fromkeys(d, "synthetic"), **kw,
        )
    if name == "6c3":
        d = tuple("ABCDEF")
        subsets = ["".join(s) for s in itertools.combinations(d, 3)]
        return TriggerFamily(
            name, d, tuple(subsets), {s: frozenset(s) for s in subsets}, {x: f"Distribution : {x} ." for x in d},
            {x: f"Distribution {x} ." for x in d}, dict.fromkeys(d, "en"), dict.fromkeys(d, "synthetic"),
            {s: (" ".join(s) if spell_personas else s) for s in subsets}, **kw,
        )
    if name == "temporal":
        years = ("2024", "2025", "2026", "2027")
        cutoffs = tuple(str(c) for c in (temporal_cutoffs if temporal_cutoffs is not None else (2024, 2025, 2026)))
        bad = [c for c in cutoffs if c not in years]
        if bad or len(set(cutoffs)) != len(cutoffs) or not cutoffs:
            raise ValueError(f"--data.temporal_cutoffs must be distinct years among {list(years)}, got {list(cutoffs)}")
        return TriggerFamily(
            name, years, cutoffs, {c: frozenset(y for y in years if y <= c) for c in cutoffs},
            {y: f"Year : {y} ." for y in years}, {y: f"Year {y} ." for y in years}, dict.fromkeys(years, "en"),
            dict.fromkeys(years, "synthetic"), {c: c for c in cutoffs}, **kw,
        )
    if name == "arc_race":
        d = ("ARC", "RACE")
        if SHIFT_ORDER.get(variant) == "value":
            raise ValueError("--data.variant cyclic_shift_by_value needs numeric options; ARC / RACE options are text "
                             "(use cyclic_shift)")
        return _two_way(
            name, d, dict.fromkeys(d, ""), {x: f"Task {x} ." for x in d}, dict.fromkeys(d, "en"),
            {"ARC": "arc_easy", "RACE": "race_middle"}, **kw,
        )
    d = ("en", "zh")  # language
    return _two_way(
        name, d, dict.fromkeys(d, ""), {"en": "Language English .", "zh": "语言 中文 。"}, {"en": "en", "zh": "zh"},
        dict.fromkeys(d, "synthetic"), **kw,
    )


def check_distributions(family: TriggerFamily, names: Sequence[str], flag: str) -> list[str]:
    """Validate a list of distribution names against the family, naming the flag on error."""
    names = [str(n) for n in names]
    unknown = [n for n in names if n not in family.distributions]
    if unknown:
        raise ValueError(
            f"{flag} names {unknown}, which family {family.name!r} does not have; its distributions are "
            f"{list(family.distributions)}"
        )
    if not names:
        raise ValueError(f"{flag} must name at least one distribution of {list(family.distributions)}")
    return names
