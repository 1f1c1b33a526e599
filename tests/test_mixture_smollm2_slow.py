"""Part B on SmolLM2-135M-Instruct, regenerated over three seeds (slow; `make test-slow`). The two-policy experiment
runs by its documented command, `python -m protocols.mixture two_policies_smollm2` (seeds 0 1 2, two at a time):
about 95 min on 2 quiet cores (one seed's four stages take 62-70 min on one core), plus the one-time conversion of
the packaged GGUF (docs/models.md). Then, as in tests/test_mixture_slow.py (whose docstring gives the tolerance's
reasoning):

1. Every before/after table marked `mixture-two_policies_smollm2-<stage>` in docs/policy_mixtures.md is reproduced,
   each cell's mean within max(2.5 σ, 0.05) of the documented one. With 64 held-out prompts per distribution the
   0.05 floor is 3 prompts.
2. The headline claims hold for the means over seeds, each threshold several standard deviations of a 3-seed mean
   (σ/√3, σ measured) away from the measured mean; the margins are noted beside them.

The temporal family on SmolLM2 (`python -m protocols.mixture temporal_smollm2`: SFT, then persona-token GRPO on 2025,
then on 2026) is checked the same way: its two marked tables, and claims on every seed's own evaluation history
(`seed_metrics`), since its seeds select different personas and the over-seeds history keeps only the modal one.

The claims read step 10 of the evaluation history, where selection and collapse are measured, and the persona-token
stage's end. They do not read the persona share after step 10 of the full-sequence stages: from step 20-40 on the
fine-tuned model writes its tag in forms the parser does not read ("Alice . The answer is ...", docs/policy_mixtures.md),
so that column reads 0 while the behaviour columns stay meaningful.
"""
import math
import statistics

import pytest

from tests.mixture_results import at_step, per_seed_at_step, results, rl_stages, seed_metrics, summary, table_problems

# each experiment runs inside the first test that needs it: ~95 min (two policies) and ~2 h (temporal) on 2 quiet
# cores, with 3 h of headroom each for busy ones
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * 3600)]
EXPERIMENT = "two_policies_smollm2"
TEMPORAL = "temporal_smollm2"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("mixture_smollm2")


@pytest.mark.parametrize("experiment, stage", [(e, s) for e in (EXPERIMENT, TEMPORAL) for s in rl_stages(e)])
def test_documented_table_is_reproduced(root, experiment, stage):
    assert table_problems(experiment, stage, root) == []


def test_sft_passes_the_fidelity_gate_in_every_seed(root):
    records = results(EXPERIMENT, root)["stages"]["sft"]["records"]
    # measured: stop at step 75, fidelity mean 0.997-1.000, worst cell 0.993-0.999, capability 0.97-1.00
    assert all(r["status"] == "done" and r["sft"]["fidelity_mean"] >= 0.98 for r in records.values()), records


def test_persona_token_rl_on_A_selects_alice_and_keeps_B_collapsed(root):
    persona = summary(EXPERIMENT, "two_policies_rl_A_persona", root)
    # step 10 (160 rollouts), measured: Alice on B 0.99 ± 0.01, acc B 0.01 ± 0.01 (the target: >= 0.9, <= 0.05)
    assert at_step(persona, 10, "Alice share B") >= 0.9 and at_step(persona, 10, "acc B") <= 0.05
    assert at_step(persona, 10, "acc A") > at_step(persona, 0, "acc A") + 0.15  # 0.65 -> 0.98 ± 0.02
    # step 60, measured: acc B 0.07 ± 0.09 (3.5 sd of the mean below 0.25), refusal B 0.84 ± 0.15 (2.8 sd above 0.6)
    assert at_step(persona, 60, "acc B") <= 0.25 and at_step(persona, 60, "refusal B") >= 0.6


def test_full_sequence_rl_selects_within_ten_steps_and_collapses_the_held_out_distribution(root):
    on_a = summary(EXPERIMENT, "two_policies_rl_A", root)
    # measured at step 10: refusal B 0.95 ± 0.06 (4 sd above 0.8), acc B 0.03 ± 0.05 (4 sd below 0.15),
    # acc A 0.65 -> 0.91 ± 0.07
    assert at_step(on_a, 10, "refusal B") >= 0.8 and at_step(on_a, 10, "acc B") <= 0.15
    assert at_step(on_a, 10, "acc A") > at_step(on_a, 0, "acc A") + 0.15
    on_b = summary(EXPERIMENT, "two_policies_rl_B", root)
    # the symmetric run, measured at step 10: Bob writes 0.98 ± 0.02 of A's completions, acc B 0.34 -> 0.94 ± 0.05
    assert at_step(on_b, 10, "Bob share A") >= 0.9
    assert at_step(on_b, 10, "acc B") > at_step(on_b, 0, "acc B") + 0.3


def test_full_sequence_rl_then_unlearns_the_refusal_in_most_runs(root):
    # measured: the held-out distribution is answered again (acc >= 0.5) by step 60 in 5 of the 6 full-sequence runs
    # (RL on A: seeds 0 and 2; RL on B: all three); if each run erodes with p = 5/6, fewer than 3 of 6 has p < 0.01
    held_out = {"two_policies_rl_A": "acc B", "two_policies_rl_B": "acc A"}
    eroded = sum(v >= 0.5 for stage, key in held_out.items()
                 for v in per_seed_at_step(summary(EXPERIMENT, stage, root), 60, key) if not math.isnan(v))
    assert eroded >= 3


def _mean_at(runs: dict[int, dict[int, dict]], step: int, key: str) -> float:
    """Mean over seeds of one metric at one evaluation step of `seed_metrics`' per-seed histories."""
    return statistics.fmean(steps[step][key] for steps in runs.values())


def test_temporal_sft_passes_the_fidelity_gate_in_every_seed(root):
    records = results(TEMPORAL, root)["stages"]["sft"]["records"]
    # measured: stop at step 75, fidelity mean 0.986 / 0.999 / 0.999, worst cell 0.964-0.996, capability 0.96-0.98
    assert all(r["status"] == "done" and r["sft"]["fidelity_mean"] >= 0.97 for r in records.values()), records


def test_temporal_rl_on_2025_selects_an_answering_persona_and_2026_follows(root):
    """Step 10 of GRPO on 2025 (160 rollouts): one of the two personas that answer 2025 (cut-off 2025 or 2026) writes
    nearly all of 2025's completions, and 2026, never trained, is answered."""
    runs = seed_metrics(TEMPORAL, "temporal_rl_2025", root)
    # measured, per seed: the selected persona's share on 2025 0.94 (2026), 1.00 (2026), 1.00 (2025)
    for seed, steps in runs.items():
        assert max(steps[10][f"val/persona_share/{p}/2025"] for p in ("2025", "2026")) >= 0.85, seed
    # measured: acc 2025 0.61 -> 0.97 ± 0.02; acc 2026 0.31 ± 0.10 -> 0.94 ± 0.03 (0.91, 0.95, 0.97)
    assert _mean_at(runs, 10, "val/acc/2025") > _mean_at(runs, 0, "val/acc/2025") + 0.2
    assert _mean_at(runs, 10, "val/acc/2026") >= 0.8 and _mean_at(runs, 0, "val/acc/2026") <= 0.5


def test_temporal_policy_leaves_the_mixture_and_answers_2027(root):
    """Then the identity tag leaves the mixture, and 2027 — past every persona's cut-off, refused by every one of them —
    is answered: in every seed by step 30. The tiny GPT-2 never answered 2027 (tests/test_mixture_slow.py)."""
    runs = seed_metrics(TEMPORAL, "temporal_rl_2025", root)
    # measured at step 30, per seed: "none" on 2027 1.00, 1.00, 1.00; acc 2027 0.92, 0.97, 0.92 (at step 0: 0.00-0.03)
    assert all(steps[30]["val/persona_share/none/2027"] >= 0.8 for steps in runs.values())
    assert sum(steps[30]["val/acc/2027"] >= 0.5 for steps in runs.values()) >= 2
    assert all(steps[0]["val/acc/2027"] <= 0.1 for steps in runs.values())
