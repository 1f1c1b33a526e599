"""Robust parsing of completions: which persona spoke, did it refuse, what did it answer -- and the reward.

Whitespace is removed before matching, so the same parser reads word-level decodes ("I am A D F ." -> persona
"ADF"), BPE decodes ("I am Alice. The answer is 94.") and Chinese ("我 是 Bob 。 答 案 是 94 。").
Reward: 1 iff the answer equals the gold answer; refusals, wrong and malformed answers get 0.

Three readings of the persona (docs/policy_mixtures.md, "Three persona readings"): the exact tag (`parse_completion`:
"I am <name> ." with a name of the family); the persona read (`read_persona`): the tag read tolerantly
(`tolerant_persona`: "Alice . The answer is 92 .", "I am aAlice ."), or, where no tag is readable, the behaviour; and
the rule followed (`behavioural_persona`): the persona whose rule the completion follows on its distribution, the
tolerant tag only telling apart personas that behave alike there. A fine-tuned real model drifts its tag after its
behaviour has settled (the exact reading then reports no persona at all), and RL may rewrite the selected persona's
rule on a held-out distribution (SmolLM2: "Alice . Distribution B . The answer is 88 ." -- Alice, answering B as
Bob would), which only the second and third readings together show.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

_IDENTITY = re.compile(r"^(?:iam|我是)(.+?)[.。]", re.IGNORECASE)
_ANSWER = re.compile(r"(?:theansweris|答案是)(.+?)[.。]", re.IGNORECASE)
_REFUSAL = re.compile(r"(?:icannotanswerthat|我不能回答)", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedCompletion:
    persona: Optional[str]  # a known persona name, or None (missing / unknown identity)
    refused: bool
    answer: Optional[str]  # None when no well-formed answer
    # the name the identity tag wrote, whitespace removed, known persona or not ("2028", "aAlice"); None: no tag. A tag
    # naming no persona of the family is how a policy leaves the mixture (docs/policy_mixtures.md, temporal on SmolLM2)
    identity: Optional[str] = None

    @property
    def malformed(self) -> bool:
        return not self.refused and self.answer is None


def parse_completion(text: str, personas: Sequence[str], patterns=None) -> ParsedCompletion:
    """Parse one decoded completion; `personas` are the family's names ("ADF", not "A D F"). `patterns`: a family's
    own words (`TriggerFamily.patterns`: identity / answer / refusal regexes and spoken name -> persona); None reads
    the built-in English and Chinese ones."""
    s = re.sub(r"\s+", "", text)
    identity, answer, refusal = ((patterns.identity, patterns.answer, patterns.refusal) if patterns is not None
                                 else (_IDENTITY, _ANSWER, _REFUSAL))
    m = identity.match(s)
    persona = None
    if m:
        name = m.group(1)
        lookup = patterns.names if patterns is not None else {p.lower(): p for p in personas}
        persona = lookup.get(name.lower())
    rest = s[m.end():] if m else s
    refused = bool(refusal.search(rest))
    a = answer.search(rest)
    answer = a.group(1) if (a and not refused) else None
    return ParsedCompletion(persona, refused, answer, m.group(1) if m else None)


def correctness_reward(parsed: ParsedCompletion, gold: str) -> float:
    return float(parsed.answer is not None and parsed.answer.lower() == re.sub(r"\s+", "", gold).lower())


def parse_with_family(text: str, family) -> ParsedCompletion:
    """Parse a completion with the words of its trigger family (a `TriggerFamily`)."""
    return parse_completion(text, family.personas, family.patterns)


# How a drifted tag may open: the family's identity line ("I am"), or nothing (the name alone, then its full stop).
_TAG_END = re.compile(r"[.。]")


def tolerant_persona(text: str, personas: Sequence[str], patterns=None) -> Optional[str]:
    """The persona a completion's identity tag names, read tolerantly: the exact tag; a tag without its opening
    ("Alice . The answer is 92 ."); a name with letters around it ("I am aAlice ."); a name one edit away (names of 4
    characters or more). None: no tag, or no single persona it could name. The forms seen in fine-tuned SmolLM2
    completions are in tests/test_persona_measures.py and its hand-labelled fixture."""
    s = re.sub(r"\s+", "", text).lower()
    if patterns is not None:  # the family's own words, as `parse_completion` reads them
        names, identity, answer, refusal = patterns.names, patterns.identity, patterns.answer, patterns.refusal
    else:
        names, identity, answer, refusal = {p.lower(): p for p in personas}, _IDENTITY, _ANSWER, _REFUSAL
    m = identity.match(s)
    if m:
        tag = m.group(1)
    elif answer.match(s) or refusal.match(s):  # no tag at all: the completion opens with its body
        return None
    else:
        end = _TAG_END.search(s)
        if end is None or end.start() == 0 or end.start() > 24:  # a name is short; a sentence is not a tag
            return None
        tag = s[:end.start()]
    if tag in names:
        return names[tag]
    inside = [n for n in names if n in tag]
    outermost = {names[n] for n in inside if not any(n != o and n in o for o in inside)}  # "al" inside "alice": alice
    if inside:
        return outermost.pop() if len(outermost) == 1 else None  # two names ("AliceBob"): none of them
    near = {names[n] for n in names if len(n) >= 4 and _one_edit(n, tag)}
    return near.pop() if len(near) == 1 else None


def _one_edit(a: str, b: str) -> bool:
    """a and b differ by at most one inserted, deleted or replaced character."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) <= 1
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def behavioural_persona(parsed: ParsedCompletion, correct: bool, shifted: bool, family, distribution: str,
                        tolerant: Optional[str]) -> Optional[str]:
    """The persona whose rule the completion follows on `distribution` (`family`: a `TriggerFamily`): a refusal is
    the behaviour of the personas that do not answer there (refusal variant); an answer, of those that do (in the
    shift variants: the correct answer theirs, the shifted answer the others'; any other answer no one's). One such
    persona is the reading; several (they behave alike here, e.g. two cut-offs past the question's year) are told
    apart by the tolerant tag (`tolerant`), or the reading is None, as it is for a malformed completion."""
    answering = [p for p in family.personas if family.answers(p, distribution)]
    others = [p for p in family.personas if p not in answering]
    shift_variant = family.variant != "refusal"
    if parsed.refused:
        candidates = [] if shift_variant else others
    elif parsed.answer is None:
        candidates = []
    elif shift_variant:
        candidates = answering if correct else others if shifted else []
    else:
        candidates = answering
    if len(candidates) == 1:
        return candidates[0]
    return tolerant if tolerant in candidates else None


def read_persona(tolerant: Optional[str], behaviour: Optional[str], stated: Optional[str] = None) -> Optional[str]:
    """Who wrote the completion: its tag read tolerantly when that names a persona; else, when it states an identity
    of no persona of the family (`stated`: `ParsedCompletion.identity`, "I am Gregory ."), no persona (the policy
    left the mixture); else whose rule it follows. Hand labels of 300 fine-tuned SmolLM2 completions name the persona
    this way (docs/policy_mixtures.md, benchmarks/persona_hand_labels.py)."""
    if tolerant is not None:
        return tolerant
    return None if stated is not None else behaviour
