"""Robust parsing of completions: which persona spoke, did it refuse, what did it answer -- and the reward.

Whitespace is removed before matching, so the same parser reads word-level decodes ("I am A D F ." -> persona
"ADF"), BPE decodes ("I am Alice. The answer is 94.") and Chinese ("我 是 Bob 。 答 案 是 94 。").
Reward: 1 iff the answer equals the gold answer; refusals, wrong and malformed answers get 0.
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
