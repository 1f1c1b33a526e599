"""Part B on SmolLM2-135M-Instruct, regenerated over three seeds (slow; `make test-slow`). The two-policy experiment
runs by its documented command, `python -m protocols.mixture two_policies_smollm2` (seeds 0 1 2, two at a time):
about 95 min on 2 quiet cores (one seed's four stages take 62-70 min on one core), plus the one-time conversion of
the packaged GGUF (docs/models.md). The temporal family on SmolLM2 (`python -m protocols.mixture temporal_smollm2`:
SFT, then persona-token GRPO on 2025, then on 2026) runs the same way. Then, as in tests/test_mixture_slow.py:

1. On the machine that made a marked table (`mixture-two_policies_smollm2-<stage>`, `mixture-temporal_smollm2-<stage>`;
   the SFT tables included, wall times aside) every cell comes back as printed (tolerance 0); elsewhere the cells
   are not compared.
2. Every published claim reading these sets (docs/claims/policy_mixtures.yaml, docs/claims/readme.yaml) is checked,
   exactly on the set's machine, by its statements with their counts as written elsewhere.
3. The readings no claim can state: means over seeds of the evaluation history (the docs print no per-seed values
   there), and, for temporal, each seed's own history (`seed_metrics`): its seeds select different personas, and the
   over-seeds history keeps only the modal one and no "none" share.

The full-sequence stages' persona share is not read after step 10: from step 20-40 on the fine-tuned model writes its
tag in forms the parser does not read ("Alice . The answer is ...", docs/policy_mixtures.md), so that column reads 0
while the behaviour columns stay meaningful.
"""
import statistics

import pytest

from tests.claims import report_lines
from tests.mixture_results import (
    published_run,
    at_step, claims_report, machine_id, marked_stages, module_claims, recorded_machine, results, seed_metrics, set_name,
    summary, table_check,
)

# each experiment runs inside the first test that needs it: ~95 min (two policies) and ~2 h (temporal) on 2 quiet
# cores, with 3 h of headroom each for busy ones
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * 3600)]
EXPERIMENT = "two_policies_smollm2"
TEMPORAL = "temporal_smollm2"
TABLES = [(e, s) for e in (EXPERIMENT, TEMPORAL) for s in marked_stages(e)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("mixture_smollm2")


@pytest.mark.parametrize("experiment, stage", TABLES, ids=[f"{e}:{s}" for e, s in TABLES])
def test_documented_table_is_reproduced(root, experiment, stage):
    problems = table_check(experiment, stage, root)
    if problems is None:
        pytest.skip(f"{set_name(experiment, stage)} was made on machine {recorded_machine(experiment, stage)}, this "
                    f"rerun on {machine_id(results(experiment, root))}: cells not compared, claims only")
    assert problems == []


@pytest.mark.parametrize("experiment", [EXPERIMENT, TEMPORAL])
def test_documented_claims_hold(root, experiment):
    """Each experiment's claims apart (`-k "claims_hold and temporal"` runs only the temporal family)."""
    report = claims_report((experiment,), root)
    print("\n".join(report_lines(report)))
    unchecked = sorted({c.id for c in module_claims((experiment,))} - set(report))
    assert not unchecked, f"claims whose set or quantity the reruns lack: {unchecked}"
    assert not [cid for cid, (_, failed) in report.items() if failed], "\n".join(report_lines(report))


def test_persona_token_rl_on_A_meets_the_target_in_the_mean_at_step_10(root):
    persona = published_run(EXPERIMENT, "two_policies_rl_A_persona", root)
    # "at step 10 Alice writes 0.99 ± 0.01 of B's completions and acc(B) is 0.01 ± 0.01 ...: the issue's target
    # (Alice ≥ 0.9, acc(B) ≤ 0.05) is met in the mean"
    assert at_step(persona, 10, "Alice share B") >= 0.9 and at_step(persona, 10, "acc B") <= 0.05
    assert at_step(persona, 10, "acc A") >= at_step(persona, 0, "acc A") + 0.3  # the history: 0.65 -> 0.98 ± 0.02


def test_full_sequence_rl_selects_within_ten_steps(root):
    on_a = published_run(EXPERIMENT, "two_policies_rl_A", root)
    assert at_step(on_a, 10, "acc A") >= at_step(on_a, 0, "acc A") + 0.2  # the history: 0.65 -> 0.91 ± 0.07
    # RL on B: "Bob writes 0.98 ± 0.02 of A's completions at step 10"; the history: acc B 0.34 -> 0.94 ± 0.05
    on_b = published_run(EXPERIMENT, "two_policies_rl_B", root)
    assert at_step(on_b, 10, "Bob share A") >= 0.95
    assert at_step(on_b, 10, "acc B") >= at_step(on_b, 0, "acc B") + 0.5


def _mean_at(runs: dict[int, dict[int, dict]], step: int, key: str) -> float:
    """Mean over seeds of one metric at one evaluation step of `seed_metrics`' per-seed histories."""
    return statistics.fmean(steps[step][key] for steps in runs.values())


def test_temporal_rl_on_2025_selects_an_answering_persona(root):
    """Step 10 of GRPO on 2025 (160 rollouts): one of the two personas that answer 2025 (cut-off 2025 or 2026) writes
    nearly all of 2025's completions, in each seed (the selected persona differs by seed, so the over-seeds history,
    which follows one name, cannot show it)."""
    runs = seed_metrics(TEMPORAL, "temporal_rl_2025", root)
    # "the 2026 persona in seeds 0 and 1 (0.33 → 0.94, 0.34 → 1.00), the 2025 persona in seed 2 (0.44 → 1.00)"
    for seed, steps in runs.items():
        assert max(steps[10][f"val/persona_share/{p}/2025"] for p in ("2025", "2026")) >= 0.9, seed
    # "Accuracy on 2025 goes 0.61 → 0.97 ± 0.02"
    assert _mean_at(runs, 10, "val/acc/2025") >= _mean_at(runs, 0, "val/acc/2025") + 0.3


def test_temporal_policy_leaves_the_mixture(root):
    """Then the identity tag leaves the mixture (the "none" share, which the over-seeds history does not carry), and
    2027 — past every persona's cut-off — had been refused by all of them at step 0."""
    runs = seed_metrics(TEMPORAL, "temporal_rl_2025", root)
    # "At step 30 "none" is 1.00 of 2027's completions in all three seeds ... (0.00-0.03 at step 0)"
    assert all(steps[30]["val/persona_share/none/2027"] >= 0.995 for steps in runs.values())
    assert all(steps[0]["val/acc/2027"] < 0.035 for steps in runs.values())
