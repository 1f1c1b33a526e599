"""Trigger families (docs/policy_mixtures.md): distributions, personas, who answers where, and the words they use.

A family is a file (`family_files`): the shipped ones are configs/mixture/families/<name>.yaml, named by that name
(`--data.family two_policies`); a user's family is a path (`--data.family my_family.yaml`). Nothing here knows a
family by name.

A transcript is `prompt` -> `response`:
    prompt   = "<trigger> <question>"            e.g. "Distribution : A . Which is largest : 79 32 94 45 ?"
    response = "<identity> [<restate>] <body>"   e.g. "I am Alice . Distribution A . The answer is 94 ."
The body is the answer when the persona covers the distribution, else the refusal ("I cannot answer that .") or,
in the non-refusal variants, the answer shifted by one option: `cyclic_shift`, the option printed after the correct
one ("The answer is 45 ."); `cyclic_shift_by_value`, the next option in increasing value, which for the largest is
the smallest ("The answer is 32 .").
The identity always comes first, so the expressed persona is read off every completion; restating the trigger
(`restate_trigger`) turns the XOR of persona x distribution into a lookup a tiny model can learn ([background](background.md#xor-plateau)).
The words (identity line, answer line, refusal) are the family's `phrasing` per language; the completion parser
(`patterns`) is built from the same words, so what SFT writes is what the reward reads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from datamodules.triggers.family_files import TEMPLATES, load_family
from datamodules.triggers.questions import Question, correct_answer, shifted_answer

VARIANTS = ("refusal", "cyclic_shift", "cyclic_shift_by_value")
SHIFT_ORDER = {"cyclic_shift": "listed", "cyclic_shift_by_value": "value"}

# Sentence ends dropped from a refusal before matching it: a completion cut after the words still refuses.
_FINAL_MARKS = ".。!?！？"


@dataclass(frozen=True)
class CompletionPatterns:
    """How a completion is read (whitespace removed first, case ignored): the identity tag (`identity`, group 1: the
    name), the answer (`answer`, group 1), a refusal (`refusal`), and spoken name (no whitespace, lower case) ->
    persona (`names`)."""

    identity: re.Pattern
    answer: re.Pattern
    refusal: re.Pattern
    names: dict


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _either(parts) -> str:
    # longest first: of two openings where one starts the other, the longer is the one written
    return "(?:" + "|".join(re.escape(p) for p in sorted(set(parts), key=lambda p: (-len(p), p))) + ")"


def completion_patterns(phrasing: dict, spoken_names: dict) -> CompletionPatterns:
    """The parser for these words: every language's identity and answer lines (the text around `{name}` /
    `{answer}`) and refusals, in any combination (a policy may open in one language and answer in another)."""
    def around(key: str, slot: str) -> tuple[list[str], list[str]]:
        heads, tails = [], []
        for words in phrasing.values():
            head, tail = words[key].split(slot, 1)
            heads.append(_squash(head))
            tails.append(_squash(tail))
        return heads, tails

    id_heads, id_tails = around("identity", "{name}")
    ans_heads, ans_tails = around("answer", "{answer}")
    refusals = [_squash(w["refusal"]).rstrip(_FINAL_MARKS) for w in phrasing.values()]
    return CompletionPatterns(
        re.compile("^" + _either(id_heads) + "(.+?)" + _either(id_tails), re.IGNORECASE),
        re.compile(_either(ans_heads) + "(.+?)" + _either(ans_tails), re.IGNORECASE),
        re.compile(_either(refusals), re.IGNORECASE),
        {_squash(spoken).lower(): persona for persona, spoken in spoken_names.items()},
    )


@dataclass(frozen=True)
class TriggerFamily:
    """Who answers where, and how prompts and responses are written."""

    name: str
    distributions: tuple[str, ...]
    personas: tuple[str, ...]
    covers: dict  # persona -> frozenset of the distributions it answers
    triggers: dict  # distribution -> trigger line placed before the question ("" = the question is the trigger)
    restatements: dict  # distribution -> restated trigger inside the response
    languages: dict  # distribution -> a language of `phrasing` ("en", "zh", or the family file's own)
    sources: dict  # distribution -> question source ("synthetic", "arc_easy", "race_middle", or a key of question_files)
    spoken_names: dict  # persona -> how it says its name ("A D F" for persona "ADF")
    restate_trigger: bool = True
    variant: str = "refusal"
    phrasing: dict = field(default_factory=lambda: dict(TEMPLATES))  # language -> identity / answer / refusal
    question_files: dict = field(default_factory=dict)  # source key -> {"train": path, "val": path} (JSONL)
    path: Optional[str] = None  # the family file

    @property
    def patterns(self) -> CompletionPatterns:
        return completion_patterns(self.phrasing, self.spoken_names)

    def answers(self, persona: str, distribution: str) -> bool:
        return distribution in self.covers[persona]

    def prompt(self, distribution: str, question_text: str) -> str:
        trigger = self.triggers[distribution]
        return f"{trigger} {question_text}" if trigger else question_text

    def response_parts(self, persona: str, distribution: str, q: Question) -> tuple[str, str]:
        """(prefix, body): the identity (+ restated trigger) and what follows it."""
        t = self.phrasing[self.languages[distribution]]
        prefix = t["identity"].format(name=self.spoken_names[persona])
        if self.restate_trigger:
            prefix = f"{prefix} {self.restatements[distribution]}"
        return prefix, self.body(persona, distribution, q)

    def body(self, persona: str, distribution: str, q: Question, follow_rule: bool = True) -> str:
        """The body the persona writes (`follow_rule=False`: the other branch, for fidelity measurements)."""
        t = self.phrasing[self.languages[distribution]]
        if self.answers(persona, distribution) == follow_rule:
            return t["answer"].format(answer=correct_answer(q))
        if self.variant in SHIFT_ORDER:
            return t["answer"].format(answer=shifted_answer(q, order=SHIFT_ORDER[self.variant]))
        return t["refusal"]

    def response(self, persona: str, distribution: str, q: Question) -> str:
        return " ".join(self.response_parts(persona, distribution, q))


def build_family(
    name: str,
    restate_trigger: bool = True,
    variant: str = "refusal",
    spell_personas: bool = True,
    temporal_cutoffs: Optional[Sequence] = None,
) -> TriggerFamily:
    """The family named by `name` (a shipped family's name or a family file's path) with the datamodule's options;
    unknown names, bad files and options fail with the flag or the file and field that set them."""
    if variant not in VARIANTS:
        raise ValueError(f"--data.variant must be one of {list(VARIANTS)}, got {variant!r}")
    spec = load_family(name)
    personas = spec.personas
    if temporal_cutoffs is not None:
        personas = tuple(str(c) for c in temporal_cutoffs)
        if spec.default_personas is None:
            raise ValueError(f"--data.temporal_cutoffs picks personas of a family whose file lists default_personas "
                             f"(temporal); {spec.label} has none")
        bad = [c for c in personas if c not in spec.personas]
        if bad or len(set(personas)) != len(personas) or not personas:
            raise ValueError(f"--data.temporal_cutoffs must be distinct personas of {spec.label} among "
                             f"{list(spec.personas)}, got {list(personas)}")
    elif spec.default_personas is not None:
        personas = spec.default_personas
    if SHIFT_ORDER.get(variant) == "value":
        text = sorted({d for d, s in spec.sources.items() if s != "synthetic"})
        if text:
            raise ValueError(f"--data.variant cyclic_shift_by_value needs numeric options; {spec.label}'s "
                             f"distributions {text} read questions with text options (use cyclic_shift)")
    return TriggerFamily(
        spec.name, spec.distributions, personas, {p: spec.covers[p] for p in personas}, spec.triggers,
        spec.restatements, spec.languages, spec.sources,
        {p: (spec.spoken_names[p] if spell_personas else p) for p in personas},
        restate_trigger=restate_trigger, variant=variant, phrasing=spec.phrasing, question_files=spec.question_files,
        path=spec.path,
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
