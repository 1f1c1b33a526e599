"""The parser behind the documented-table tests, on a literal table, and every marked table in docs/ parses."""
import glob
import os
import re

import pytest

from tests.doc_tables import (ROOT, Dominant, documented_columns, documented_table, first_table, parse_dominant,
                               parse_dominant_cell, parse_mean_std_table, parse_table, table_after, table_differences)

TABLE = """| method | ID acc | WRG | PGR |
|---|---|---|---|
| teacher | 85.7 | 0 | – |
| naive | 89.0 ± 1.2 | **+3.3** | 0.12 |
| anchor | 94.0 | −1.5 ± 0.4 | 0.5 |
"""


def test_parse_table_takes_the_first_number_of_each_cell():
    rows = parse_table(TABLE)
    assert rows == {"teacher": {"ID acc": 85.7, "WRG": 0.0},
                    "naive": {"ID acc": 89.0, "WRG": 3.3, "PGR": 0.12},
                    "anchor": {"ID acc": 94.0, "WRG": -1.5, "PGR": 0.5}}


def test_first_table_stops_at_the_first_table_of_a_report():
    report = "What to look for: ...\n\n" + TABLE + "\nThe teacher's labels:\n\n| seed | error rate |\n|---|---|\n| 0 | 0.101 |\n"
    assert first_table(report) == TABLE
    assert parse_table(first_table(report)) == parse_table(TABLE)  # the second table's rows would be 'seed', '---', '0'


def test_table_after_takes_the_first_table_below_its_heading():
    second = "| method | ID acc |\n|---|---|\n| naive | 91.5 |\n"
    report = TABLE + "\nSelection `weak_val` (no gold):\n\n- anchor: seed 0: 10\n\n" + second + "\nMore:\n\n" + TABLE
    assert parse_table(table_after(report, "Selection `weak_val`")) == {"naive": {"ID acc": 91.5}}
    with pytest.raises(AssertionError, match="no line starting with"):
        table_after(report, "Selection `oracle`")


def test_table_differences_names_each_cell_out_of_tolerance():
    doc = parse_table(TABLE)
    run = {k: dict(v) for k, v in doc.items()}
    run["naive"]["WRG"] = 4.5
    del run["anchor"]
    assert table_differences(doc, run, 1.0) == ["naive / WRG: documented 3.3, measured 4.5", "row 'anchor' missing from the run"]
    run["naive"]["WRG"] = 4.2
    assert table_differences(doc, run, 1.0) == ["row 'anchor' missing from the run"]


def test_a_report_with_the_accuracy_columns_compares_with_a_table_published_without_them():
    """The W2S report prints `OOD acc <target>` beside each `AOG <target>` and a `mean OOD acc` (issue 47); the tables
    in docs/results.md were published before. The slow reruns and bench_demo compare the documented cells only, by
    header: the new columns are ignored, a changed documented cell is still caught."""
    from protocols.w2s.report import aggregate, display_columns, markdown_table

    doc = parse_table(documented_table("results.md", "w2s-demo"))
    targets = [col[4:] for col in doc["teacher"] if col.startswith("AOG ")]
    cols = display_columns("synth_helpful_cooking", targets, True, ["drift/ood_mean/mse/layer6",
                                                                    "drift/ood_mean/cka/layer6"])
    assert set(doc["naive"]) <= {name for _, name in cols}  # every documented header is still printed, spelled alike
    table = {}
    for row, values in doc.items():  # a run that reproduces the documented cells, plus OOD accuracies of 50 %
        table[row] = {}
        for key, name in cols:
            value = values.get(name, 50.0 if "OOD acc" in name else None)
            if value is not None:
                table[row][key] = {"mean": value, "std": None, "n": 1, "ci95": None, "per_seed": {0: value}}
    measured = parse_table(first_table(markdown_table(table, cols, 1)))
    assert measured["naive"][f"OOD acc {targets[0]}"] == 50.0 and "mean OOD acc" in measured["naive"]
    assert table_differences(doc, measured, 0.051) == []
    assert documented_columns(measured, doc) == doc
    measured["naive"][f"AOG {targets[1]}"] += 2.0
    assert table_differences(doc, measured, 1.0) == [f"naive / AOG {targets[1]}: documented -5.0, measured -3.0"]


def test_parse_mean_std_table_reads_the_multi_seed_cells():
    rows = parse_mean_std_table("| distribution | acc after | dominant after | share |\n|---|---|---|---|\n"
                                "| B | 0.66 ± 0.34 (0.26, 0.85, 0.87) | Alice (3/3 seeds) | −0.10 ± 0.02 (1 seed) |\n")
    assert rows == {"B": {"acc after": (0.66, 0.34), "share": (-0.10, 0.02)}}


def test_a_number_keeps_its_exponent():
    """The drift cells print 8.02e-05: read as 8.02 (the mantissa), a 100x change would pass a 10 % tolerance."""
    table = ("| method | drift mse | drift cka | big |\n|---|---|---|---|\n"
             "| anchor | 8.02e-05 ± 5.8e-06 | 1 ± 4.5e-05 | 1.2e+03 |\n| naive | −3E-2 | 0.5 | 12 |\n")
    assert parse_table(table) == {"anchor": {"drift mse": 8.02e-05, "drift cka": 1.0, "big": 1200.0},
                                  "naive": {"drift mse": -0.03, "drift cka": 0.5, "big": 12.0}}
    assert parse_mean_std_table(table) == {"anchor": {"drift mse": (8.02e-05, 5.8e-06), "drift cka": (1.0, 4.5e-05)},
                                           "naive": {}}
    moved = {"anchor": {"drift mse": 8.02e-03}}
    assert table_differences({"anchor": {"drift mse": 8.02e-05}}, moved, lambda c, v: 0.1 * abs(v)) == [
        "anchor / drift mse: documented 8.02e-05, measured 0.00802"]


# every form of the "dominant after" cell that docs/policy_mixtures.md prints
DOMINANT_FORMS = {
    "Alice (3/3 seeds)": Dominant((("Alice", 3, 3),), None),
    "2026 (2/3 seeds)": Dominant((("2026", 2, 3),), None),
    "Bob (1/3 seeds), no tag (2/3 seeds)": Dominant((("Bob", 1, 3), ("no tag", 2, 3)), None),
    "2026 (1/3 seeds), no tag (2/3 seeds); shares: 2024": Dominant((("2026", 1, 3), ("no tag", 2, 3)), "2024"),
    "no tag (3/3 seeds); shares: Alice": Dominant((("no tag", 3, 3),), "Alice"),
}


@pytest.mark.parametrize("cell", list(DOMINANT_FORMS))
def test_each_dominant_after_form_parses(cell):
    assert parse_dominant_cell(cell) == DOMINANT_FORMS[cell]


def test_a_dominant_cell_that_is_not_one_raises():
    for cell in ("Alice", "Alice (3 seeds)", "0.66 ± 0.34", ""):
        with pytest.raises(AssertionError, match="not a 'dominant after' cell"):
            parse_dominant_cell(cell)


def test_parse_dominant_reads_what_the_report_writes():
    """The cells of protocols.mixture.report's own table, from a literal summary: seed 1 of B has no tag, so B's cell
    counts it apart and names the share persona (Bob, the modal winner over all seeds) after the tagged one."""
    from protocols.mixture.report import _dominant_cell

    summary = {"seeds": [0, 1, 2], "winner": {"A": "Alice", "B": "Bob"},
               "winners": {"A": {0: "Alice", 1: "Alice", 2: "Bob"}, "B": {0: "Alice", 1: "Bob", 2: "Bob"}},
               "untagged": {"A": {0: False, 1: False, 2: False}, "B": {0: False, 1: True, 2: True}}}
    table = "| distribution | acc after | dominant after |\n|---|---|---|\n" + "".join(
        f"| {d} | 0.5 ± 0.1 (0.4, 0.5, 0.6) | {_dominant_cell(summary, d)} |\n" for d in ("A", "B"))
    assert parse_dominant(table) == {"A": Dominant((("Alice", 2, 3),), None),
                                     "B": Dominant((("Alice", 1, 3), ("no tag", 2, 3)), "Bob")}


def test_part_b_cell_problems_compare_the_dominant_cell_exactly():
    from tests.mixture_results import cell_problems

    doc = ("| distribution | acc after | dominant after |\n|---|---|---|\n"
           "| A | 0.90 ± 0.01 (0.89, 0.90, 0.91) | Alice (3/3 seeds) |\n")
    assert cell_problems(doc, doc) == []
    run = doc.replace("Alice (3/3 seeds)", "Alice (2/3 seeds)")  # one seed fewer: the acc cell still matches
    assert cell_problems(doc, run) == ["A / dominant after: documented Dominant(parts=(('Alice', 3, 3),), shares=None), "
                                       "measured Dominant(parts=(('Alice', 2, 3),), shares=None)"]
    run = doc.replace("Alice (3/3 seeds)", "Bob (3/3 seeds)")
    assert len(cell_problems(doc, run)) == 1


MARKED = [(os.path.basename(p), name) for p in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
          for name in re.findall(r"<!-- table: ([\w.-]+) -->", open(p, encoding="utf-8").read())]


@pytest.mark.parametrize("page, name", MARKED, ids=[f"{p}:{n}" for p, n in MARKED])
def test_marked_tables_parse_and_name_their_command(page, name):
    rows = parse_table(documented_table(page, name))
    assert rows and all(rows.values())
    text = open(os.path.join(ROOT, "docs", page), encoding="utf-8").read()
    before = text[:text.index(f"<!-- table: {name} -->")]
    section = before[before.rindex("\n#"):]  # from the table's heading on
    assert "Command:" in section, f"docs/{page}: the section of table {name!r} must name the command that regenerates it"
