"""The Part B slow tests' machinery (tests/mixture_results.py) on hand-made results: a marked table is compared cell
for cell only on the machine its set header records, every published Part B claim reads a set a slow module reruns,
and the claims are checked against a stage summary (or an SFT stage's records) with their counts as written."""
import importlib
import re

import pytest

import tests.mixture_results as mr
from protocols.mixture.report import summary_markdown
from tests.claims import ROOT, applies_on, load_claims, sets_of

SLOW_MODULES = ("tests.test_mixture_slow", "tests.test_mixture_smollm2_slow")


def _summary(acc_after_b=(0.01, 0.85, 0.89), winners_b=("Alice", "Alice", "Alice")) -> dict:
    """A two-distribution stage summary as results.json holds it (seeds as strings once read back)."""
    rows = {d: {"acc_before": [0.38, 0.49, 0.37], "acc_after": [0.92, 0.84, 0.88], "refusal_before": [0.5] * 3,
                "refusal_after": [0.0] * 3, "malformed_after": [0.0] * 3, "share_before": [0.44, 0.59, 0.42],
                "share_after": [0.99, 0.94, 0.91]} for d in "AB"}
    rows["B"]["acc_after"] = list(acc_after_b)
    winners = {"A": {"0": "Alice", "1": "Alice", "2": "Alice"}, "B": dict(zip("012", winners_b))}
    return {"seeds": [0, 1, 2], "distributions": ["A", "B"], "trained": ["A"], "winner": {"A": "Alice", "B": "Alice"},
            "winners": winners, "untagged": {d: {s: False for s in "012"} for d in "AB"}, "rows": rows,
            "history": {"0": {"acc B": [0.46, 0.31, 0.62]}, "10": {"acc B": [0.0, 0.0, 0.09]}}}


def _run(machine: str, **summary_args) -> dict:
    done = {s: {"status": "done"} for s in "012"}
    return {"machine": {"id": machine}, "stages": {"two_policies_rl_A": {"records": done, "summary": _summary(**summary_args)}}}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """`results("two_policies", tmp_path)` answers a hand-made run; the marked table is the unchanged run's rendering
    and its header records machine "made-here"."""
    monkeypatch.setattr(mr, "_runs", {})
    monkeypatch.setattr(mr, "documented_table", lambda page, name: summary_markdown(_summary()))
    monkeypatch.setattr(mr, "sets_of", lambda page: {"mixture-two_policies-two_policies_rl_A": {"machine": "made-here"}})

    def use(run: dict) -> None:
        mr._runs[("two_policies", str(tmp_path))] = run
    return use


def test_on_the_machine_that_made_the_table_every_cell_is_compared_as_printed(fake, tmp_path):
    fake(_run("made-here"))
    assert mr.table_check("two_policies", "two_policies_rl_A", tmp_path) == []
    # one seed's acc(B) 0.85 -> 0.86: the mean (0.58) and std (0.50) print the same, the per-seed value does not
    fake(_run("made-here", acc_after_b=(0.01, 0.86, 0.89)))
    assert mr.table_check("two_policies", "two_policies_rl_A", tmp_path) == [
        "B / acc after: documented 0.58 ± 0.50 (0.01, 0.85, 0.89), measured 0.59 ± 0.50 (0.01, 0.86, 0.89)"]
    fake(_run("made-here", winners_b=("Alice", "Bob", "Alice")))
    assert [p.split(":")[0] for p in mr.table_check("two_policies", "two_policies_rl_A", tmp_path)] == [
        "B / dominant after"]


def test_on_another_machine_or_an_unrecorded_set_no_cell_is_compared(fake, tmp_path, monkeypatch):
    fake(_run("elsewhere", acc_after_b=(0.5, 0.5, 0.5)))
    assert mr.table_check("two_policies", "two_policies_rl_A", tmp_path) is None
    monkeypatch.setattr(mr, "sets_of", lambda page: {"mixture-two_policies-two_policies_rl_A": {"machine": "unrecorded"}})
    fake({**_run("unrecorded"), "machine": None})  # a run recorded before fingerprints: its id is None, never a match
    assert mr.machine_id(mr.results("two_policies", tmp_path)) is None
    assert mr.table_check("two_policies", "two_policies_rl_A", tmp_path) is None


def test_sft_tables_leave_the_wall_time_out():
    doc = ("| seed | status | stop step | fidelity mean | fidelity min cell | capability | wall s |\n|---|---|---|---|---|---|---|\n"
           "| 0 | done | 75 | 1.000 | 0.999 | 0.97 | 790 |\n")
    assert mr.cell_problems(doc, doc.replace("790", "812")) == []
    assert mr.cell_problems(doc, doc.replace("1.000", "0.999")) == [
        "0 / fidelity mean: documented 1.000, measured 0.999"]


def test_set_names_split_into_experiment_and_stage():
    assert mr.split_set("mixture-two_policies_selection-two_policies_rl_A_lr3e-4") == (
        "two_policies_selection", "two_policies_rl_A_lr3e-4")


def _smollm2_run(collapse_b_on_a=(0.00, 0.00, 0.92)) -> dict:
    """two_policies_smollm2 with the per-seed values every published claim on it states (docs/claims/*.yaml)."""
    done = {s: {"status": "done"} for s in "012"}

    def stage(rows: dict, history: dict) -> dict:
        return {"records": done, "summary": {"rows": rows, "history": history}}
    sft = {s: {"status": "done", "sft": {"steps": 75, "fidelity_mean": f, "fidelity_min": 0.99, "capability": 0.98}}
           for s, f in zip("012", (1.0, 0.999, 0.997))}
    return {"machine": {"id": "elsewhere"}, "stages": {
        "sft": {"records": sft},
        "two_policies_rl_A": stage({"B": {"acc_after": [0.86, 0.00, 0.98], "share_after": [0.0, 0.0, 0.0]}},
                                   {"10": {"acc B": [0.00, 0.00, 0.09]}, "60": {"acc B": [0.86, 0.00, 0.98]}}),
        "two_policies_rl_A_persona": stage({"B": {"refusal_after": [0.81, 0.70, 1.00], "share_after": [0.0, 0.0, 0.98]}},
                                           {"10": {"acc B": [0.00, 0.00, 0.02]}}),
        "two_policies_rl_B": stage({"A": {"acc_after": [0.83, 0.92, 0.98]}},
                                   {"10": {"acc A": list(collapse_b_on_a)}, "60": {"acc A": [0.83, 0.92, 0.98]}}),
    }}


def test_claims_read_the_reruns_and_count_as_written(monkeypatch, tmp_path):
    monkeypatch.setattr(mr, "_runs", {("two_policies_smollm2", str(tmp_path)): _smollm2_run()})
    report = mr.claims_report(("two_policies_smollm2",), tmp_path)
    # every claim that applies on the run's machine read its set; the AMD EPYC rerun's twins apply only there
    claims = mr.module_claims(("two_policies_smollm2",))
    assert set(report) == {c.id for c in claims if applies_on(c, "elsewhere")}
    assert {"s2-sft-stop-step", "s2-collapse-within-10", "readme-smollm2-unlearns"} <= set(report)
    assert {c.id for c in claims if not applies_on(c, "elsewhere")} == {f"{i}-epyc" for i in report}
    assert all(mode == "claims" and not failed for mode, failed in report.values()), report
    # RL on B's seed 2 collapsing too makes it 6 of 6 collapses and 5 of 6 recoveries: "5 of 6", "4 of 6" both fail
    mr._runs[("two_policies_smollm2", str(tmp_path))] = _smollm2_run(collapse_b_on_a=(0.00, 0.00, 0.00))
    report = mr.claims_report(("two_policies_smollm2",), tmp_path)
    failed = sorted(cid for cid, (_, problems) in report.items() if problems)
    assert failed == ["readme-smollm2-collapse-within-10", "readme-smollm2-unlearns", "s2-collapse-within-10",
                      "s2-unlearns-after-collapse", "summary-partb-collapse-at-step-10",
                      "summary-partb-full-sequence-recovers"]


def test_every_marked_part_b_table_is_a_declared_set():
    text = open(f"{ROOT}/docs/policy_mixtures.md", encoding="utf-8").read()
    marked = set(re.findall(r"<!-- table: (mixture-[\w.-]+) -->", text))
    headers = sets_of("policy_mixtures")
    assert marked == set(headers)
    assert all({"seeds", "machine", "rerun"} <= set(h) for h in headers.values()), headers


def _experiments(module: str) -> tuple[str, ...]:
    m = importlib.import_module(module)
    return tuple(m.EXPERIMENTS) if hasattr(m, "EXPERIMENTS") else (m.EXPERIMENT, m.TEMPORAL)


@pytest.mark.parametrize("module", SLOW_MODULES)
def test_each_slow_module_reruns_the_sets_it_is_named_for(module):
    named = {mr.split_set(name)[0] for name, h in sets_of("policy_mixtures").items()
             if h["rerun"] == module.replace(".", "/") + ".py"}
    assert named == set(_experiments(module))


def test_every_part_b_claim_is_checked_by_one_slow_module():
    """A claim whose sets two modules make would be checked by neither (`module_claims` wants all of a claim's sets)."""
    part_b = [c.id for page in ("policy_mixtures", "readme", "results") for c in load_claims(page)
              if any(s.startswith("mixture-") for s in c.set_names)]
    checked = [c.id for m in SLOW_MODULES for c in mr.module_claims(_experiments(m))]
    assert sorted(checked) == sorted(part_b)
