"""The documented Part A tables, regenerated (slow; `make test-slow`).

Each test reruns a set by its documented command, then (issue 50, docs/claims.md):
- on the machine that made the set (its claims header's `machine` is this run's fingerprint id,
  `protocols/engine/machine.py`), every cell of each marked table must equal the regenerated one as printed
  (tolerance 0), and every claim reading the set must hold exactly (its per-seed values, mean and interval);
- on any other machine the cells are not compared (float rounding differs between CPUs and BLAS builds, and a new
  draw of a seed is not an error): every claim's statements are checked with their counts as written, and the test
  prints which held.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.claims import (
    PAGES, check, load_claims, numbers_digest, recorded_on, report_lines, run_machine, set_header,
)
from tests.doc_tables import (
    ROOT, documented_columns, documented_table, first_table, parse_table, table_after, table_differences,
)

# setup.cfg's 900 s per-test timeout guards the fast suite; these runs take 5 min to 6 h on one quiet core (the two
# longest, issue 36's budget-matched tables, carry their own limit)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * 3600)]


def run_and_compare(config: str, table: str, out, results: str = "results.md", later: dict | None = None) -> None:
    """Run a protocol config into `out`; compare its `results` (the set's stable name) with the table marked `table`
    in docs/results.md, cell for cell where this machine made it; check every claim reading the set. `later` maps
    more marked tables to the report line they follow (the `weak_val` table under its heading)."""
    subprocess.run([sys.executable, "-m", "protocols.w2s", "--config", config, f"--out_dir={out}"], cwd=ROOT, check=True)
    report = open(os.path.join(out, results), encoding="utf-8").read()
    with open(os.path.join(out, results[:-len(".md")] + ".json"), encoding="utf-8") as f:
        run = json.load(f)
    here = run_machine(run)
    pairs = [(table, first_table(report))] + [(name, table_after(report, heading)) for name, heading in (later or {}).items()]
    for name, markdown in pairs:
        measured, documented = parse_table(markdown), parse_table(documented_table("results.md", name))
        assert set(documented) == set(measured), (name, sorted(documented), sorted(measured))
        header = set_header(name)
        if recorded_on(header, here):  # the machine that made it: the same run to the last bit
            assert table_differences(documented, documented_columns(measured, documented), 0.0) == [], name
            if "numbers" in header:
                assert numbers_digest(run) == header["numbers"], f"{name}: a number differs from the run published"
        else:
            print(f"{name}: made on machine {header.get('machine')}, this is {here}: cells not compared, claims only")
    names = {table, *(later or {})}
    claims = [c for page in PAGES for c in load_claims(page) if set(c.set_names) <= names]
    outcome = check(claims, lambda name: run if name in names else {}[name], lambda name: here)
    print("\n".join(report_lines(outcome)))
    assert not [cid for cid, (_, failed) in outcome.items() if failed], "\n".join(report_lines(outcome))


def write_advice_benchmark() -> None:
    """The advice benchmark's hub-schema files, as its configs' headers say (deterministic: seed 0)."""
    subprocess.run([sys.executable, "-m", "datamodules.preference.write_hub_benchmark", "--benchmark", "advice",
                    "--out", "runs/bench/advice"], cwd=ROOT, check=True)


def test_make_demo_reproduces_the_documented_table(tmp_path):
    run_and_compare("configs/experiment/w2s_demo.yaml", "w2s-demo", tmp_path / "w2s_demo")


def test_five_seed_naive_failure_table(tmp_path):
    """Issue 10's claim table (docs/results.md `w2s-small-vocab`, 5 seeds: mean ± std cells) — about 45 min on 2 cores."""
    run_and_compare("configs/experiment/w2s_small_vocab.yaml", "w2s-small-vocab", tmp_path / "w2s_small_vocab")


def test_five_seed_baseline_comparison_table(tmp_path):
    """Issue 23's comparison (docs/results.md `w2s-baselines`: every method under id_val selection, 5 seeds) — about
    80 min on 2 quiet cores (w2s_small_vocab's stages, then 14 fits and 10 evaluations per seed)."""
    run_and_compare("configs/experiment/w2s_baselines.yaml", "w2s-baselines", tmp_path / "w2s_baselines",
                    results="results_baselines.md")


def test_smollm2_student_table(tmp_path):
    """Issue 37's Part A on a real pretrained student (docs/results.md `w2s-smollm2`: SmolLM2-135M-Instruct over the
    MiniLM teacher, 3 seeds, id_val selection) — about 2.5 h on one quiet core, plus the one-time conversion of the
    packaged GGUF (docs/models.md). The test splits are a seeded 100 pairs each, so 1 point is one pair."""
    run_and_compare("configs/experiment/w2s_smollm2.yaml", "w2s-smollm2", tmp_path / "w2s_smollm2",
                    later={"w2s-smollm2-weak-val": "Selection `weak_val`"})


def test_smollm2_student_advice_table(tmp_path):
    """Issue 37's second benchmark for the SmolLM2 student (docs/results.md `w2s-smollm2-advice`: the advice benchmark
    of the regime table, its fitted MiniLM teacher, 3 seeds, id_val selection) — about 2.5 h on one quiet core. The
    benchmark's hub-schema files are written first."""
    write_advice_benchmark()
    run_and_compare("configs/experiment/w2s_smollm2_advice.yaml", "w2s-smollm2-advice", tmp_path / "w2s_smollm2_advice")


@pytest.mark.timeout(8 * 3600)  # past the module's 3 h
def test_budget_matched_helpful_tables(tmp_path):
    """Issue 36 on the helpful benchmark (docs/results.md `w2s-budget-helpful` under `id_val`, `w2s-budget-helpful-weak-val`
    under `weak_val`: the budget-matched controls, the reward-model regularisers and the weight averages beside ANCHOR,
    5 seeds) — about 6 h on one quiet core (35 stages per seed, ~2 min each)."""
    run_and_compare("configs/experiment/w2s_budget_matched.yaml", "w2s-budget-helpful", tmp_path / "w2s_budget",
                    results="results_budget.md", later={"w2s-budget-helpful-weak-val": "Selection `weak_val`"})


@pytest.mark.timeout(5 * 3600)  # past the module's 3 h
def test_budget_matched_advice_tables(tmp_path):
    """Issue 36 on the advice benchmark (docs/results.md `w2s-budget-advice` under `id_val`, `w2s-budget-advice-weak-val`
    under `weak_val`: the helpful benchmark's rows and grids, unchanged, 5 seeds) — about 3.5 h on one quiet core (34
    stages per seed, 40-45 core-minutes per seed). The benchmark's hub-schema files are written first."""
    write_advice_benchmark()
    run_and_compare("configs/experiment/w2s_budget_matched_advice.yaml", "w2s-budget-advice",
                    tmp_path / "w2s_budget_advice", results="results_budget.md",
                    later={"w2s-budget-advice-weak-val": "Selection `weak_val`"})


def test_multi_teacher_table(tmp_path):
    """Issue 36's multi-teacher row (docs/results.md `w2s-multi-teacher`: naive, the best single teacher among four and
    the student that learns weights over them, 5 seeds, id_val selection) — about 2 h on one quiet core."""
    run_and_compare("configs/experiment/w2s_multi_teacher.yaml", "w2s-multi-teacher", tmp_path / "w2s_multi",
                    results="results_multi_teacher.md")
