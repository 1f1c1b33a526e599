"""The teacher's error structure on the student half, against hand-counted values."""
import pytest

from datamodules.preference.label_diagnostics import weak_label_diagnostics
from datamodules.preference.sources import build_source


def _records(sides):
    return [{"id": str(i), "side": side} for i, side in enumerate(sides)]


def test_error_structure_matches_hand_counts():
    # (q = P(a ≻ b), swapped: a = rejected) -> P(chosen) = q or 1 − q
    labels = {"0": (0.9, False),  # P(chosen) 0.9: right, artifact on chosen
              "1": (0.8, True),   # P(chosen) 0.2: wrong (confidence 0.8), artifact on rejected
              "2": (0.3, False),  # P(chosen) 0.3: wrong (0.7), artifact on rejected
              "3": (0.4, True),   # P(chosen) 0.6: right, artifact on rejected
              "4": (0.45, False)}  # P(chosen) 0.45: wrong (0.55), artifact on chosen
    records = _records(["chosen", "rejected", "rejected", "rejected", "chosen"])
    out = weak_label_diagnostics(records, labels, lambda r: r["side"])
    assert out["pairs"] == 5
    assert out["error_rate"] == pytest.approx(3 / 5)
    assert out["confidence_when_wrong"] == pytest.approx((0.8 + 0.7 + 0.55) / 3)
    assert out["confidence_when_right"] == pytest.approx((0.9 + 0.6) / 2)
    assert out["artifact_on_rejected_share"] == pytest.approx(3 / 5)
    assert out["errors_with_artifact_on_rejected"] == pytest.approx(2 / 3)
    assert out["error_rate_artifact_on_rejected"] == pytest.approx(2 / 3)
    assert out["error_rate_artifact_on_chosen"] == pytest.approx(1 / 2)
    # sides with the artifact: pair 0 (chosen, P 0.9 yes), 1 (rejected, P(chosen) 0.2 yes), 2 (yes), 3 (no), 4 (no)
    assert out["agreement_with_artifact"] == pytest.approx(3 / 5)
    assert "agreement_with_artifact" not in weak_label_diagnostics(records, labels)
    with pytest.raises(ValueError, match="no pairs"):
        weak_label_diagnostics([], {})


def test_synthetic_sources_say_which_response_carries_the_artifact():
    source = build_source("synth_helpful_travel", n_test=40)
    rows, records = source.rows("test"), source.load("test").records
    assert len(rows) == len(records) == 40
    for row, record in zip(rows, records):
        expected = {True: "chosen", False: "rejected", None: None}[row["artifact_on_chosen"]]
        assert source.artifact_side(record) == expected
    tech = build_source("synth_helpful_tech", n_test=20)
    assert {tech.artifact_side(r) for r in tech.load("test").records} == {None}


def test_teacher_structure_splits_accuracy_by_where_the_artifact_sits():
    """Accuracy per subset: all pairs, artifact on chosen / on rejected / absent; a margin > 0 is right."""
    from protocols.w2s.teacher_structure import markdown, split_structure

    records = [{"id": i, "side": s} for i, s in enumerate(["chosen", "chosen", "rejected", "rejected", "rejected", None])]
    margins = [1.0, -0.5, 0.2, -1.0, -2.0, 0.3]
    out = split_structure(records, margins, lambda r: r["side"])
    assert out["all"] == {"acc": 50.0, "pairs": 6}
    assert out["chosen"] == {"acc": 50.0, "pairs": 2}
    assert out["rejected"]["pairs"] == 3 and abs(out["rejected"]["acc"] - 100 / 3) < 1e-9
    assert out["none"] == {"acc": 100.0, "pairs": 1}
    assert split_structure(records[:1], margins[:1], lambda r: r["side"])["rejected"] is None
    assert markdown({"test/x": out}).splitlines()[2] == "| test/x | 50.0 (6) | 50.0 (2) | 33.3 (3) | 100.0 (1) |"
