"""The W2S report a reader reads (issue 47, item 5), rendered from hand-made stage results: absolute accuracies
beside the gains they are differences of, a legend naming each column and its unit, PGR apart from the points, the
`weak_val` table printed only where it differs from the `id_val` one, and figures that say what they plot."""
import pytest

from protocols.w2s.protocol import parse
from tests.doc_tables import first_table, parse_table, table_after
from tests.test_w2s_protocol import _write

ID, OOD = "S", "T"


def _protocol(tmp_path, methods, seeds=(0,)):
    return parse(["--config", _write(tmp_path, {
        "out_dir": str(tmp_path / "run"), "trainer_configs": [], "data_configs": [], "student_configs": [],
        "teacher_configs": [__file__], "methods": methods, "paired_reference": None, "seeds": list(seeds)})])


def _teacher(id_acc, ood_acc):
    """A teacher stage's result: its own test accuracies (fractions, as cli.py test writes them)."""
    return {"test": {ID: {"acc": id_acc / 100.0, "pairs": 100}, OOD: {"acc": ood_acc / 100.0, "pairs": 100}}}


def _student(student, teacher, ceiling_id=None, val=(90.0, 80.0)):
    """A student stage's result: both models' accuracies (%) on the same pairs and the scores they give."""
    wrg, aog = student[0] - teacher[0], student[1] - teacher[1]
    transfer = {"acc_student": {ID: student[0], OOD: student[1]}, "acc_teacher": {ID: teacher[0], OOD: teacher[1]},
                "wrg": wrg, "aog": {OOD: aog}, "aog_mean": aog, "nts": aog - max(0.0, -wrg)}
    if ceiling_id is not None:
        transfer["pgr"] = wrg / (ceiling_id - teacher[0])
    return {"test": {ID: {"acc": student[0] / 100.0}, OOD: {"acc": student[1] / 100.0}, "transfer": transfer},
            "val_acc": val[0], "val_weak_acc": val[1], "identity": {"checkpoint": "last"}}


def _run(tmp_path, teacher=(84.0, 18.0), naive=(90.0, 99.0)):
    """Teacher 84 % ID, 18 % OOD; a gold ceiling 100 / 99; naive as given: one seed, nothing swept."""
    from protocols.w2s.report import summarize

    p = _protocol(tmp_path, [{"name": "naive", "objective": "naive"}])
    raw = {"teacher": {0: _teacher(*teacher)}, "ceiling": {0: _student((100.0, 99.0), teacher)},
           "naive": {0: _student(naive, teacher, ceiling_id=100.0)}}
    return p, raw, summarize(p, raw)


def test_an_aog_of_81_reads_as_18_to_99_beside_it(tmp_path):
    _, _, results = _run(tmp_path)
    md = results["markdown"]
    table = first_table(md)
    header = table.splitlines()[0]
    assert header == ("| method | ID acc | WRG | OOD acc T | AOG T | mean AOG | NTS | PGR |")
    rows = parse_table(table)
    assert rows["teacher"] == {"ID acc": 84.0, "WRG": 0.0, "OOD acc T": 18.0, "AOG T": 0.0, "mean AOG": 0.0,
                               "NTS": 0.0}
    assert rows["naive"] == {"ID acc": 90.0, "WRG": 6.0, "OOD acc T": 99.0, "AOG T": 81.0, "mean AOG": 81.0,
                             "NTS": 81.0, "PGR": 0.375}
    assert "| naive | 90.0 | +6.0 | 99.0 | +81.0 | +81.0 | +81.0 | 0.375 |" in table
    assert "| ceiling | 100.0 | +16.0 | 99.0 | +81.0 | +81.0 | +81.0 | – |" in table
    assert results["rows"]["naive"]["acc_ood_mean"]["per_seed"] == {0: 99.0}
    assert results["units"]["acc/T"] == "percent" and results["units"]["aog/T"] == "percent points"
    assert results["units"]["pgr"] == "ratio"


def test_the_caption_keeps_pgr_out_of_the_points_and_a_legend_is_under_the_table(tmp_path):
    _, _, results = _run(tmp_path)
    md = results["markdown"]
    lines = md.splitlines()
    start = lines.index(first_table(md).splitlines()[0])
    caption = lines[start - 2]
    assert caption == ("1 seed; accuracies (ID acc, OOD acc) in %, gains (WRG, AOG, NTS) in percent points, PGR a "
                       "ratio. Teacher and student scored on the same pairs.")
    assert "Percent points" not in md
    below = "\n".join(lines[start:start + 20])
    assert ("Legend (ID = the source's test split `S`; each gain is the row's accuracy minus the teacher's on the same "
            "pairs; e.g. naive on T: OOD acc 99.0 − the teacher's 18.0 = AOG +81.0):") in below
    for words in ("- ID acc, OOD acc <target> (%)", "- WRG, weak-to-strong gain (percent points)",
                  "- AOG <target>, absolute OOD gain (percent points)", "- NTS, net transfer score (percent points)",
                  "max(0, teacher's ID acc − the row's ID acc)",
                  "- PGR, performance gap recovered (a ratio, not points): WRG / (the ceiling's ID acc − the "
                  "teacher's ID acc)"):
        assert words in below, words
    assert "OOD drift" not in below  # no drift column: no words about it


def test_two_targets_get_a_mean_ood_accuracy_and_drift_its_words(tmp_path):
    from protocols.w2s.report import aggregate, display_columns, legend, markdown_table

    def stage(acc_s, acc_t):
        tr = {"acc_student": acc_s, "acc_teacher": acc_t, "wrg": acc_s["S"] - acc_t["S"],
              "aog": {t: acc_s[t] - acc_t[t] for t in ("A", "B")}}
        tr["aog_mean"] = sum(tr["aog"].values()) / 2
        tr["nts"] = tr["aog_mean"]
        return {"test": {"transfer": tr}, "drift": {"ood_mean": {"mse": {"layer2": 0.5}, "cka": {"layer2": 0.9}}}}

    teacher = {"test": {"S": {"acc": 0.8}, "A": {"acc": 0.2}, "B": {"acc": 0.4}}}
    table = aggregate({"teacher": {0: teacher}, "naive": {0: stage({"S": 85.0, "A": 30.0, "B": 70.0},
                                                                    {"S": 80.0, "A": 20.0, "B": 40.0})}}, "S")
    cols = display_columns("S", ["A", "B"], False, ["drift/ood_mean/mse/layer2", "drift/ood_mean/cka/layer2"])
    assert [name for _, name in cols] == ["ID acc", "WRG", "OOD acc A", "AOG A", "OOD acc B", "AOG B", "mean OOD acc",
                                          "mean AOG", "NTS", "OOD drift mse (layer2)", "OOD drift cka (layer2)"]
    md = markdown_table(table, cols, 1, legend(cols, "S", 1))
    assert "| teacher | 80.0 | +0.0 | 20.0 | +0.0 | 40.0 | +0.0 | 30.0 | +0.0 | +0.0 | – | – |" in md
    assert "| naive | 85.0 | +5.0 | 30.0 | +10.0 | 70.0 | +30.0 | 50.0 | +20.0 | +20.0 | 0.5 | 0.9 |" in md
    assert "drift in its own units" in md and "- OOD drift mse / cka (layer k)" in md and "PGR" not in md


def test_weak_val_is_one_line_when_it_is_the_id_val_table(tmp_path):
    _, _, results = _run(tmp_path)
    md = results["markdown"]
    assert md.count("| method | ID acc |") == 1 and results["weak_val_same_as_id_val"] is True
    assert ("Under `weak_val` (the strict weak-to-strong reading: every swept value and stopping point chosen by "
            "agreement with the teacher's labels on the ID validation split; no gold label, no target data) the table "
            "is the `id_val` table above, cell for cell (no row is chosen on validation data: nothing is swept and "
            "nothing stops early); it is not printed again.") in md
    assert "Selection `weak_val`" not in md
    assert results["weak_val_rows"]["naive"]["nts"]["per_seed"] == {0: 81.0}  # still in results.json


def test_weak_val_is_printed_when_its_picks_differ(tmp_path):
    """A λ sweep whose values the two rules rank apart: gold validation picks λ = 1, the teacher's labels λ = 2."""
    from protocols.w2s.report import summarize

    p = _protocol(tmp_path, [{"name": "anchor", "objective": "naive", "sweep": {"--model.anchor_coef": [1.0, 2.0]}}])
    teacher = (84.0, 18.0)
    raw = {"teacher": {0: _teacher(*teacher)},
           "anchor@anchor_coef=1.0": {0: _student((90.0, 99.0), teacher, val=(95.0, 70.0))},
           "anchor@anchor_coef=2.0": {0: _student((86.0, 40.0), teacher, val=(85.0, 90.0))}}
    results = summarize(p, raw)
    md = results["markdown"]
    # the id_val table, the weak_val one and the oracle's (an upper bound)
    assert results["weak_val_same_as_id_val"] is False and md.count("| method | ID acc |") == 3
    assert parse_table(first_table(md))["anchor"]["OOD acc T"] == 99.0
    weak = parse_table(table_after(md, "Selection `weak_val`"))
    assert weak["anchor"] == {"ID acc": 86.0, "WRG": 2.0, "OOD acc T": 40.0, "AOG T": 22.0, "mean AOG": 22.0,
                              "NTS": 22.0}
    after = md[md.index("Selection `weak_val`"):]
    assert after.count("Columns and units as in the legend under the first table: accuracies in %, WRG / AOG / NTS in "
                       "percent points against the teacher row.\n") == 2  # weak_val's, the oracle's; no PGR column


def test_a_row_scored_against_another_teacher_accuracy_is_named(tmp_path):
    """The teacher row says 18 % OOD; on naive's pairs the teacher got 20 %: naive's AOG is against 20 %, so the
    legend names it instead of letting 99 − 18 be read as its gain."""
    from protocols.w2s.report import aggregate, teacher_differences_line

    table = aggregate({"teacher": {0: _teacher(84.0, 18.0)}, "naive": {0: _student((90.0, 99.0), (84.0, 20.0))}}, ID)
    assert teacher_differences_line(table, ID, [OOD]) == (
        "- The teacher scored differently on these rows' pairs or seeds than in its own row, and their gains are "
        "against the former (results.json: `teacher_acc/<split>`): naive on T: 20.0 (teacher row 18.0).")
    same = aggregate({"teacher": {0: _teacher(84.0, 18.0)}, "naive": {0: _student((90.0, 99.0), (84.0, 18.0))}}, ID)
    assert teacher_differences_line(same, ID, [OOD]) == ""


def test_figures_name_their_units_and_annotate_the_accuracies(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from protocols.w2s.figures import aog_heatmap, drift_label

    _, _, results = _run(tmp_path)
    table = results["rows"]
    fig = aog_heatmap(plt, table, ["ceiling", "naive"], [OOD])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["+81.0\n18% → 99%", "+81.0\n18% → 99%"]
    assert ax.get_xlabel() == "OOD target" and ax.get_ylabel() == "method"
    assert fig.axes[1].get_ylabel() == "AOG (percent points)"
    plt.close(fig)
    assert drift_label("drift/ood_mean/cka/layer6") == (
        "OOD drift: CKA similarity to the initial weights, hidden layer 6 (mean over targets)")


def test_the_regime_table_gives_the_accuracies_behind_naive_gains_and_a_legend(tmp_path):
    """The regime table's WRG and worst-AOG cells end with the teacher → naive accuracies (the teacher's on naive's
    pairs), and a legend names each column's unit."""
    import json
    import os

    from protocols.w2s.regime_table import main as regime_table

    cell = lambda *v: {"per_seed": {str(i): x for i, x in enumerate(v)}}  # noqa: E731
    rows = {"teacher": {"acc/S": cell(84.0, 86.0), "acc/T": cell(18.0, 20.0)},
            "naive": {"wrg": cell(1.0, 3.0), "aog/T": cell(-2.0, -4.0), "nts": cell(-2.0, -4.0),
                      "acc/S": cell(85.0, 89.0), "acc/T": cell(16.0, 16.0),
                      "teacher_acc/S": cell(84.0, 86.0), "teacher_acc/T": cell(18.0, 20.0)}}
    os.makedirs(tmp_path / "run" / "results")
    json.dump({"id_source": "S", "targets": ["T"], "seeds": [0, 1], "rows": rows},
              open(tmp_path / "run" / "results" / "results.json", "w"))
    json.dump({"stages": {}}, open(tmp_path / "run" / "results" / "set.json", "w"))
    text = regime_table(["--run", f"bench={tmp_path / 'run'}"])
    row = text.splitlines()[2].split(" | ")
    # t(1) = 12.706; WRG 2.0 ± 1.414 → half width 12.706 · 1.414 / √2 = 12.7
    assert row[6:9] == ["85.0 ± 1.4", "+2.0 [-10.7, +14.7] (teacher 85.0 → naive 87.0)",
                        "-3.0 [-15.7, +9.7] (T: teacher 19.0 → naive 16.0)"]
    assert "\nLegend (accuracies and shares in %, gains in percent points;" in text
    assert "- naive worst AOG: naive's OOD accuracy − the teacher's on the target where that gain is lowest" in text


def test_docs_show_the_report_as_it_is_rendered(tmp_path):
    """docs/w2s.md's example of the table (caption, table, legend) is this report, verbatim."""
    import os

    md = _run(tmp_path)[2]["markdown"]
    parts = md.split("\n\n")
    start = next(i for i, part in enumerate(parts) if part.startswith("1 seed; accuracies"))
    shown = "\n\n".join(parts[start:start + 3])
    assert shown.splitlines()[-1].startswith("- PGR, performance gap recovered")
    docs = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "w2s.md"), encoding="utf-8").read()
    assert f"```text\n{shown}\n```" in docs
