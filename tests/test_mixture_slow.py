"""CPU reproductions of the policy-mixture results (slow; run by hand: pytest -m slow tests/test_mixture_slow.py).

Thresholds sit well inside what seed 0 measured (docs/policy_mixtures.md), not at the paper's idealised values.
"""
import subprocess
import sys

import pytest

from mixture_fixtures import ROOT

pytestmark = pytest.mark.slow


def _rows(run_name, stage):
    from protocols.mixture_two_policies import newest_table

    return {r["distribution"]: r for r in newest_table(run_name, stage)["rows"]}


def test_two_policies_rl_on_A_selects_alice():
    subprocess.run([sys.executable, "-m", "protocols.mixture_two_policies"], cwd=ROOT, check=True)
    full = _rows("two_policies_rl_A", "two_policies_rl_A")
    # held-out B (identical questions): the persona that refuses B takes over, accuracy there falls
    assert full["B"]["dominant_after"] == "Alice" and full["B"]["dominant_share_after"] > 0.7
    assert full["B"]["acc_after"] < 0.7 * full["B"]["acc_before"]
    assert full["A"]["acc_after"] > full["A"]["acc_before"] + 0.2
    persona = _rows("two_policies_rl_A_persona", "two_policies_rl_A")
    assert persona["B"]["dominant_share_after"] > 0.85 and persona["B"]["acc_after"] < 0.08


def test_two_policies_rl_on_B_is_symmetric():
    subprocess.run([sys.executable, "-m", "protocols.mixture_two_policies", "--skip-sft", "--symmetric"], cwd=ROOT,
                   check=True)
    rows = _rows("two_policies_rl_B", "two_policies_rl_B")
    assert rows["A"]["dominant_after"] == "Bob" and rows["A"]["acc_after"] < 0.8 * rows["A"]["acc_before"]
    assert rows["B"]["acc_after"] > rows["B"]["acc_before"] + 0.2
