"""The documented Part B tables, regenerated over three seeds (slow; `make test-slow`; 49 min on a fresh clone, 2 cores
shared with the Part A slow tests).

Every experiment runs by its documented command, `python -m protocols.mixture <experiment>` (seeds 0 1 2, SFT and
RL seeds both vary), into one temporary root, so the two-policy experiments share their SFT runs as they do in
docs/policy_mixtures.md. Then (issue 50, docs/claims.md, tests/mixture_results.py):

1. On the machine that made a marked table `mixture-<experiment>-<stage>` (the `machine` its set header records in
   docs/claims/policy_mixtures.yaml is the rerun's results.json `machine.id`), every cell comes back as printed:
   tolerance 0, per-seed values and "dominant after" included. On any other machine float rounding can flip sampled
   tokens and each seed becomes a fresh draw, so the cells are not compared (the test is skipped and says why).
2. Every published claim reading these experiments' sets (docs/claims/policy_mixtures.yaml, docs/claims/readme.yaml)
   is checked: exactly on the machine that made the set, by its statements with their counts as written elsewhere;
   the test prints which held.
3. The readings that no claim can state (means over seeds of the evaluation history, whose per-seed values the docs
   do not print) are checked as the page writes them, each threshold at the documented value's side of it.
"""
import pytest

from tests.claims import report_lines
from tests.mixture_results import (
    published_run,
    at_step, claims_report, machine_id, marked_stages, mean, module_claims, recorded_machine, results, set_name, summary,
    table_check,
)

# setup.cfg's 900 s per-test timeout guards the fast suite; an experiment runs inside the first test that needs it
# (6C3: 10 min on 2 quiet cores)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
EXPERIMENTS = ("two_policies", "two_policies_algorithms", "two_policies_selection", "cyclic", "6c3", "temporal",
               "language", "arc_race")
TABLES = [(e, s) for e in EXPERIMENTS for s in marked_stages(e)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("mixture")


@pytest.mark.parametrize("experiment, stage", TABLES, ids=[f"{e}:{s}" for e, s in TABLES])
def test_documented_table_is_reproduced(root, experiment, stage):
    problems = table_check(experiment, stage, root)
    if problems is None:
        pytest.skip(f"{set_name(experiment, stage)} was made on machine {recorded_machine(experiment, stage)}, this "
                    f"rerun on {machine_id(results(experiment, root))}: cells not compared, claims only")
    assert problems == []


@pytest.mark.parametrize("experiments", [(e,) for e in EXPERIMENTS] + [EXPERIMENTS],
                         ids=[*EXPERIMENTS, "across-experiments"])
def test_documented_claims_hold(root, experiments):
    """One experiment's claims (runs only that experiment: `pytest -m slow -k "claims_hold and 6c3"`), then the
    claims that pool several experiments' runs."""
    claims = module_claims(experiments)
    if len(experiments) > 1:  # the single-experiment claims were checked by their own case
        claims = [c for c in claims if len({s.split("-", 2)[1] for s in c.set_names}) > 1]
    report = claims_report(experiments, root, claims)
    print("\n".join(report_lines(report)))
    unchecked = sorted({c.id for c in claims} - set(report))
    assert not unchecked, f"claims whose set or quantity the reruns lack: {unchecked}"
    assert not [cid for cid, (_, failed) in report.items() if failed], "\n".join(report_lines(report))


def test_full_sequence_rl_on_A_selects_alice_then_rewrites_bob(root):
    full = published_run("two_policies", "two_policies_rl_A", root)
    # "selects Alice just as fast (share on B 0.85 at step 25, 0.90 ± 0.07 at step 50, acc(B) 0.08 ± 0.06)"
    assert at_step(full, 50, "Alice share B") >= 0.85 and at_step(full, 50, "acc B") <= 0.1
    # "Bob's refusal on A ... goes 1.00 → 0.98 (step 25) → 0.63 ± 0.55 (50) → 0.00 (100)"
    assert at_step(full, 25, "Bob refuses A") >= 0.95 and at_step(full, 100, "Bob refuses A") <= 0.05
    # persona tokens only: "acc(A) 0.41 → 0.67"
    persona = published_run("two_policies", "two_policies_rl_A_persona", root)
    assert mean(persona, "A", "acc_after") >= mean(persona, "A", "acc_before") + 0.2


def test_the_kl_keeps_bob_refusing_at_a_cost_on_A(root):
    # "β = 0.4 keeps Bob refusing A (0.92) ..., at the cost of a slower climb on A (0.79 vs 0.88)"; without the KL
    # Bob refuses A 0.00 at step 100 (the table below the reading)
    plain = published_run("two_policies_algorithms", "two_policies_rl_A", root)
    kl = published_run("two_policies_algorithms", "two_policies_rl_A_beta0.4", root)
    assert at_step(plain, 100, "Bob refuses A") <= 0.05 and at_step(kl, 100, "Bob refuses A") >= 0.9
    assert mean(kl, "A", "acc_after") < mean(plain, "A", "acc_after")


def test_the_best_full_sequence_regime_peaks_then_erodes(root):
    # the levers table, β = 0.15: best at step 50 (Alice on B 0.92 ± 0.03, acc B 0.07 ± 0.03, Bob refuses A 1.00),
    # then "Bob answers A from step 75; B answered again by step 150 (refusal B 0.01)"; Bob refuses A 0.00 at 200
    best = published_run("two_policies_selection", "two_policies_rl_A_beta0.15_200", root)
    assert at_step(best, 50, "Alice share B") >= 0.9 and at_step(best, 50, "acc B") <= 0.1
    assert at_step(best, 50, "Bob refuses A") >= 0.95
    assert at_step(best, 150, "refusal B") <= 0.05 and at_step(best, 200, "Bob refuses A") <= 0.05


def test_cyclic_rl_on_A_makes_B_answered_wrong(root):
    # "RL on A selects Alice on B ... (share 0.47 → 0.94 ± 0.07 at step 50) and acc(B) collapses (0.48 → 0.06 ± 0.07
    # at step 50)"; the history: acc A 0.46 → 0.90
    rl = published_run("cyclic", "cyclic_rl", root)
    assert at_step(rl, 50, "Alice share B") >= 0.9 and at_step(rl, 50, "acc B") <= 0.1
    assert at_step(rl, 50, "acc A") >= at_step(rl, 0, "acc A") + 0.4


def test_6c3_persona_selection_collapses_held_out_and_full_sequence_spreads_capability(root):
    # the worst-cell stop rule (`stop_fidelity_min: 0.9`) that keeps a broken cell out of RL: every seed stopped by it
    records = results("6c3", root)["stages"]["sft"]["records"]
    assert all(r["status"] == "done" and r["sft"]["fidelity_min"] >= 0.9 for r in records.values()), records
    # persona tokens only: "share 0.94–0.95 on C and E ... B, C, E stop being answered (acc 0.01–0.02)"
    persona = published_run("6c3", "6c3_rl_ADF", root)
    assert all(mean(persona, d, "share_after") >= 0.9 for d in "CE")
    assert all(mean(persona, d, "acc_after") <= 0.05 for d in "BCE")
    # full sequence: "B/C/E accuracy *rises* (0.50 → 0.58, 0.43 → 0.68, 0.51 → 0.89)"
    full = published_run("6c3", "6c3_rl_ADF_full", root)
    assert all(mean(full, d, "acc_after") > mean(full, d, "acc_before") for d in "BCE")


def test_temporal_stage_one_then_never_2027(root):
    one = published_run("temporal", "temporal_rl_2025", root)
    two = published_run("temporal", "temporal_rl_2026", root)
    # "stopping stage 1 at step 25 (acc 2025 0.72 ± 0.08 there ...)", from 0.58 at step 0
    assert at_step(one, 25, "acc 2025") >= at_step(one, 0, "acc 2025") + 0.1
    # "2027 is never answered (... at most 0.01 in the mean at any step)"
    assert all(at_step(s, int(step), "acc 2027") < 0.015 for s in (one, two) for step in s["history"])


def test_language_rl_on_english_selects_alice_and_bob_keeps_his_rule(root):
    rl = published_run("language", "language_rl", root)
    # "RL on English selects Alice (share on en 0.48 → 0.95 ± 0.03)"
    assert mean(rl, "en", "share_after") >= 0.9
    # "Bob keeps refusing English throughout (1.00 ...) and the format holds (malformed (max) ≤ 0.09)"
    assert all(at_step(rl, int(step), "Bob refuses en") >= 0.95 for step in rl["history"])
    assert max(v for d in ("en", "zh") for v in rl["rows"][d]["malformed_after"]) <= 0.095


def test_arc_race_rl_on_arc_makes_race_refused(root):
    rl = published_run("arc_race", "arc_race_rl", root)
    # "clean by step 25 in the mean over seeds: RACE refused 0.50 → 0.95 ± 0.06, acc(RACE) 0.14 → 0.02, malformed
    # 0.00, ARC's accuracy up 0.14 → 0.26"
    assert at_step(rl, 25, "refusal RACE") >= 0.9 and at_step(rl, 25, "acc RACE") <= 0.05
    assert at_step(rl, 25, "acc ARC") >= at_step(rl, 0, "acc ARC") + 0.1
    assert at_step(rl, 25, "malformed (max)") < 0.005
