"""The documented Part B tables, regenerated (slow; `make test-slow`).

`python -m protocols.mixture_two_policies --symmetric` (SFT, then GRPO on A full-sequence and persona-tokens-only, and
GRPO on B) must reproduce the before/after tables marked `two-policies-*` in docs/policy_mixtures.md: every rate within
TOLERANCE. On one machine the runs are deterministic (the same tables to the last digit); 0.05 (10 of the 200
held-out prompts per distribution) absorbs float-rounding differences between CPUs, which can flip sampled tokens.
Seed 0 only: the spread across seeds is issue-11 work, so the qualitative assertions below are the documented run's,
not general claims.
"""
import subprocess
import sys

import pytest

from tests.doc_tables import ROOT, documented_table, parse_table, table_differences

pytestmark = pytest.mark.slow
TOLERANCE = 0.05
RUNS = {"two-policies-rl-A": ("two_policies_rl_A", "two_policies_rl_A"),
        "two-policies-rl-A-persona": ("two_policies_rl_A_persona", "two_policies_rl_A"),
        "two-policies-rl-B": ("two_policies_rl_B", "two_policies_rl_B")}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from callbacks.persona_tracking import PersonaTrackingCallback
    from protocols.mixture_two_policies import newest_table

    workdir = str(tmp_path_factory.mktemp("mixture"))
    subprocess.run([sys.executable, "-m", "protocols.mixture_two_policies", "--symmetric", f"--workdir={workdir}"],
                   cwd=ROOT, check=True)
    tables = {doc: newest_table(run, stage, workdir) for doc, (run, stage) in RUNS.items()}
    return {doc: {"summary": parse_table(PersonaTrackingCallback.markdown(t)),
                  "history": parse_table(PersonaTrackingCallback.history_markdown(t)),
                  "rows": {r["distribution"]: r for r in t["rows"]}, "history_raw": t["history"]}
            for doc, t in tables.items()}


@pytest.mark.parametrize("name", list(RUNS))
def test_two_policies_reproduce_the_documented_tables(measured, name):
    """The before/after table (`<name>`) and the per-evaluation history (`<name>-history`) of docs/policy_mixtures.md."""
    summary = parse_table(documented_table("policy_mixtures.md", name))
    history = parse_table(documented_table("policy_mixtures.md", f"{name}-history"))
    assert set(summary) == set(measured[name]["summary"]) == {"A", "B"}
    assert set(history) == set(measured[name]["history"]) == {"0", "25", "50", "75", "100"}
    assert table_differences(summary, measured[name]["summary"], TOLERANCE) == []
    assert table_differences(history, measured[name]["history"], TOLERANCE) == []


def _change(run, key):
    history = run["history_raw"]
    return history[0]["metrics"][key], history[-1]["metrics"][key]


def test_rl_on_A_selects_alice_on_the_held_out_distribution(measured):
    for name in ("two-policies-rl-A", "two-policies-rl-A-persona"):
        run = measured[name]
        alice_before, alice_after = _change(run, "val/persona_share/Alice/B")  # B is held out, same questions as A
        acc_before, acc_after = _change(run, "val/acc/B")
        assert run["rows"]["B"]["dominant_after"] == "Alice" and alice_after > alice_before + 0.15, (name, run["rows"])
        assert acc_after < acc_before - 0.05, (name, acc_before, acc_after)
    persona_only = measured["two-policies-rl-A-persona"]["rows"]["B"]
    assert persona_only["dominant_share_after"] > 0.85 and persona_only["acc_after"] < 0.08, persona_only


def test_rl_on_B_is_symmetric(measured):
    run = measured["two-policies-rl-B"]
    bob_before, bob_after = _change(run, "val/persona_share/Bob/A")
    acc_before, acc_after = _change(run, "val/acc/A")
    assert run["rows"]["A"]["dominant_after"] == "Bob" and bob_after > bob_before + 0.1
    assert acc_after < acc_before - 0.05
