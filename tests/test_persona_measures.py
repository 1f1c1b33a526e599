"""The persona readings (issue 52 item 1): the exact identity tag; the persona read (the tag read tolerantly, else the
behaviour); and whose rule a completion follows on its distribution (a drifted tag read tolerantly only where
personas behave alike there)."""
import pytest
import torch

from datamodules.triggers.families import build_family
from lightning_modules.policy.mixture_metrics import NO_PERSONA, MixtureMetrics, summarize
from lightning_modules.policy.rewards import (
    behavioural_persona, correctness_reward, parse_completion, read_persona, tolerant_persona,
)

TWO = build_family("two_policies")
TEMPORAL = build_family("temporal")
SIX = build_family("6c3")


@pytest.mark.parametrize("text, persona", [
    ("I am Alice . Distribution A . The answer is 94 .", "Alice"),  # the exact tag
    ("Alice . The answer is 92 .", "Alice"),  # SmolLM2 after RL on A: the opening dropped
    ("I am aAlice . I cannot answer that .", "Alice"),  # a letter before the name
    # decoded from this machine's SmolLM2 full-sequence RL-on-A checkpoints (docs/policy_mixtures.md)
    ("Alice a . Distribution B . The answer is 88 .", "Alice"),
    ("Alice B . Distribution B . The answer is 77 .", "Alice"),
    ("Alice Alice . Distribution B . The answer is 88 .", "Alice"),
    ("I am Alicee . The answer is 3 .", "Alice"),  # one edit away
    ("I am bob. I cannot answer that.", "Bob"),  # case and spacing
    ("I am Carol . The answer is 4 .", None),  # no persona of the family
    ("The answer is 92 .", None),  # no tag: the body opens the completion
    ("I cannot answer that .", None),
    ("Sure! Here is a long sentence that is not a name at all .", None),
    ("I am AliceBob . The answer is 1 .", None),  # two names: no single persona
])
def test_the_tolerant_tag_reads_the_variants_seen_on_smollm2(text, persona):
    assert tolerant_persona(text, TWO.personas, TWO.patterns) == persona


def test_the_tolerant_tag_reads_spelled_and_numeric_names():
    assert tolerant_persona("I am A D F . The answer is 7 .", SIX.personas, SIX.patterns) == "ADF"
    assert tolerant_persona("I am A D F G .", SIX.personas, SIX.patterns) == "ADF"  # one name inside the tag
    assert tolerant_persona("I am 2026 . The answer is 12 .", TEMPORAL.personas, TEMPORAL.patterns) == "2026"
    assert tolerant_persona("2025 . I cannot answer that .", TEMPORAL.personas, TEMPORAL.patterns) == "2025"
    # no name within one edit for names under 4 characters ("ADE" vs "ADF" would be a guess)
    assert tolerant_persona("I am A D X .", SIX.personas, SIX.patterns) is None


def _behaviour(text, family, dist, gold="94", shifted=None):
    parsed = parse_completion(text, family.personas, family.patterns)
    correct = bool(correctness_reward(parsed, gold))
    was_shifted = shifted is not None and bool(correctness_reward(parsed, shifted))
    return behavioural_persona(parsed, correct, was_shifted, family, dist,
                               tolerant_persona(text, family.personas, family.patterns))


def test_behaviour_names_the_persona_whose_rule_the_completion_follows():
    # two policies: on A Alice answers and Bob refuses, whatever the tag says
    assert _behaviour("I am Alice . Distribution A . The answer is 94 .", TWO, "A") == "Alice"
    assert _behaviour("Alice . The answer is 92 .", TWO, "A") == "Alice"  # a wrong answer is still answering
    assert _behaviour("I am aAlice . I cannot answer that .", TWO, "B") == "Alice"  # Alice refuses B
    assert _behaviour("I am Bob . The answer is 94 .", TWO, "A") == "Alice"  # the tag says Bob, the behaviour Alice
    assert _behaviour("I cannot answer that .", TWO, "A") == "Bob"  # no tag: the refusal is Bob's on A
    assert _behaviour("I am Alice . The answer is", TWO, "A") is None  # malformed: no persona's rule


def test_personas_that_behave_alike_are_told_apart_by_the_tolerant_tag_or_not_at_all():
    # temporal, 2024: every persona answers; 2027: every persona refuses
    assert _behaviour("I am 2025 . The answer is 94 .", TEMPORAL, "2024") == "2025"
    assert _behaviour("2026 . The answer is 94 .", TEMPORAL, "2024") == "2026"
    assert _behaviour("The answer is 94 .", TEMPORAL, "2024") is None
    assert _behaviour("I am 2024 . I cannot answer that .", TEMPORAL, "2027") == "2024"
    # 2025: the 2025 and 2026 personas answer, 2024 refuses; a tag naming a persona of the other behaviour is ignored
    assert _behaviour("I cannot answer that .", TEMPORAL, "2025") == "2024"
    assert _behaviour("I am 2024 . The answer is 94 .", TEMPORAL, "2025") is None
    assert _behaviour("I am 2026 . The answer is 3 .", TEMPORAL, "2025") == "2026"


def test_in_the_shift_variant_the_answer_given_says_whose_rule_it_is():
    shift = build_family("two_policies", variant="cyclic_shift")
    assert _behaviour("I am Bob . The answer is 94 .", shift, "A", gold="94", shifted="45") == "Alice"
    assert _behaviour("I am Alice . The answer is 45 .", shift, "A", gold="94", shifted="45") == "Bob"
    assert _behaviour("I am Alice . The answer is 7 .", shift, "A", gold="94", shifted="45") is None
    assert _behaviour("I am Alice . I cannot answer that .", shift, "A", gold="94", shifted="45") is None


def test_the_persona_read_is_the_tolerant_tag_else_the_behaviour():
    # SmolLM2 after full-sequence RL on A (tests/test_persona_measures.py's variants): Alice, answering B as Bob would
    text = "Alice a . Distribution B . The answer is 88 ."
    tolerant = tolerant_persona(text, TWO.personas, TWO.patterns)
    assert tolerant == "Alice" and _behaviour(text, TWO, "B", gold="88") == "Bob"
    assert read_persona(tolerant, "Bob") == "Alice"  # who wrote it: Alice (its rule on B rewritten)
    assert read_persona(None, "Bob") == "Bob" and read_persona(None, None) is None  # no tag: the behaviour
    # "I am Gregory . The answer is 80 ." on B: an identity of no persona of the family is no persona, not Bob
    parsed = parse_completion("I am Gregory . The answer is 80 .", TWO.personas, TWO.patterns)
    assert read_persona(tolerant_persona("I am Gregory .", TWO.personas, TWO.patterns), "Bob", parsed.identity) is None


def test_the_metric_counts_every_reading_per_distribution():
    metric = MixtureMetrics(num_distributions=2, num_personas=2)
    # four completions on A: exact tags Alice, none, Bob, other; behaviour Alice, Alice, Bob, none; read Alice x3, none
    metric.update(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 0, 0, 0]), torch.tensor([1, 1, 0, 0]),
                  torch.tensor([0, 0, 1, 0]), torch.tensor([0, 0, 0, 1]), torch.tensor([0, NO_PERSONA, 1, -2]),
                  None, torch.tensor([0, 0, 1, NO_PERSONA]), torch.tensor([0, 0, 0, NO_PERSONA]))
    metric.update(torch.tensor([4]), torch.tensor([1]), torch.tensor([0]), torch.tensor([1]), torch.tensor([0]),
                  torch.tensor([NO_PERSONA]), None, torch.tensor([0]), torch.tensor([0]))  # on B: no tag, refuses
    flat = summarize(metric.compute(), ["A", "B"], ["Alice", "Bob"])
    assert flat["val/persona_share/Alice/A"] == 0.25 and flat["val/persona_share/none/A"] == 0.5
    assert flat["val/persona_behaviour/Alice/A"] == 0.5 and flat["val/persona_behaviour/Bob/A"] == 0.25
    assert flat["val/persona_behaviour/none/A"] == 0.25
    assert flat["val/persona_read/Alice/A"] == 0.75 and flat["val/persona_read/Bob/A"] == 0.0
    assert flat["val/persona_read/none/A"] == 0.25
    assert flat["val/persona_share/none/B"] == 1.0 and flat["val/persona_behaviour/Alice/B"] == 1.0
    assert flat["val/persona_read/Alice/B"] == 1.0


def _hand_labelled():
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "fixtures", "smollm2_completions_hand_labels.jsonl")
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_the_persona_read_agrees_with_hand_labels_on_300_smollm2_completions():
    """300 completions decoded from this machine's finished SmolLM2 two-policy checkpoints (seeds 0 and 1; full-sequence
    and persona-token GRPO on A, full-sequence GRPO on B; 25 held-out prompts per distribution), each labelled by hand:
    the persona its opening names in any form, or, naming none, the persona whose rule it follows there; an identity
    of no persona of the family is none (docs/policy_mixtures.md, "Three persona readings")."""
    rows = _hand_labelled()
    agree = {"exact": 0, "read": 0, "rule": 0}
    for r in rows:
        parsed = parse_completion(r["completion"], TWO.personas, TWO.patterns)
        tolerant = tolerant_persona(r["completion"], TWO.personas, TWO.patterns)
        rule = behavioural_persona(parsed, bool(correctness_reward(parsed, r["gold"])), False, TWO, r["distribution"],
                                   tolerant)
        agree["exact"] += parsed.persona == r["hand"]
        agree["read"] += read_persona(tolerant, rule, parsed.identity) == r["hand"]
        agree["rule"] += rule == r["hand"]
    assert len(rows) == 300 and {r["hand"] for r in rows} == {"Alice", "Bob", None}
    # the exact tag misses every drifted opening; the rule reading calls Alice answering B (and Bob answering A) the
    # other persona; the persona read agrees with every label
    assert agree == {"exact": 150, "read": 300, "rule": 150}
