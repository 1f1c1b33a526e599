"""WRG / AOG / NTS / PGR against hand-computed values, and the TransferScores metric's de-duplication."""
import math

import pytest
import torch

from lightning_modules.reward.metrics import TransferScores, transfer_scores


def test_formulas_by_hand():
    teacher = {"S": 80.0, "T1": 60.0, "T2": 50.0}
    student = {"S": 85.0, "T1": 55.0, "T2": 70.0}
    s = transfer_scores(teacher, student, "S", ceiling={"S": 90.0})
    assert s["wrg"] == 5.0
    assert s["aog"] == {"T1": -5.0, "T2": 20.0}
    assert s["aog_mean"] == 7.5
    assert s["nts"] == 7.5  # the student does not lose ID accuracy: no penalty
    assert s["pgr"] == pytest.approx(0.5)  # 5 of the 10-point gap to the ceiling


def test_nts_penalises_an_id_loss():
    s = transfer_scores({"S": 80.0, "T": 60.0}, {"S": 74.0, "T": 70.0}, "S")
    assert s["wrg"] == -6.0 and s["aog_mean"] == 10.0 and s["nts"] == 4.0
    assert "pgr" not in s


def test_pgr_undefined_when_the_ceiling_equals_the_teacher():
    assert math.isnan(transfer_scores({"S": 70.0}, {"S": 72.0}, "S", ceiling={"S": 70.0})["pgr"])


def test_metric_counts_each_pair_once_and_compares_on_the_same_pairs():
    m = TransferScores(["S", "T"], "S", ceiling={"S": 100.0})
    # S: 4 pairs; student right on 0,1,2, teacher right on 0,1; pair 0 repeated (DDP padding)
    m.update("S", torch.tensor([1.0, 2.0, 0.5, -1.0]), torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.tensor([0, 1, 2, 3]))
    m.update("S", torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([0]))
    # T: 3 pairs; student right on 1 of 3, teacher on 2 of 3
    m.update("T", torch.tensor([-1.0, 1.0, -2.0]), torch.tensor([1.0, 1.0, -1.0]), torch.tensor([0, 1, 2]))
    out = m.compute()
    assert out["pairs"] == {"S": 4, "T": 3}
    assert out["acc_student"] == {"S": 75.0, "T": pytest.approx(100 / 3)}
    assert out["acc_teacher"] == {"S": 50.0, "T": pytest.approx(200 / 3)}
    assert out["wrg"] == 25.0
    assert out["aog"]["T"] == pytest.approx(-100 / 3)
    assert out["nts"] == pytest.approx(-100 / 3)
    assert out["pgr"] == pytest.approx(0.5)


def test_unknown_id_split_is_rejected():
    with pytest.raises(ValueError, match="id split"):
        TransferScores(["A", "B"], "S")
