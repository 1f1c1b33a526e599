"""Reward-model losses against hand-computed values."""
import math

import pytest
import torch

from lightning_modules.reward.losses import (
    bradley_terry_loss, confidence_w2s_loss, hardened_student_labels, masked_mse, reward_centering_loss, selected_mse,
    soft_bradley_terry_loss,
)
from lightning_modules.reward.objectives import OBJECTIVES, ConfidenceW2S, GoldBradleyTerry, SoftBradleyTerry


def test_bradley_terry_matches_hand_computation():
    # -log σ(0) = 0.693147, -log σ(1) = 0.313262, -log σ(-2) = 2.126928
    loss = bradley_terry_loss(torch.tensor([0.0, 1.0, -2.0]))
    assert loss.item() == pytest.approx((0.693147 + 0.313262 + 2.126928) / 3, abs=1e-5)


def test_soft_bradley_terry_matches_hand_computation():
    # -(q log σ(Δ) + (1-q) log σ(-Δ)): 0.693147; 0.8*0.313262+0.2*1.313262; 0.1*2.126928+0.9*0.126928
    loss = soft_bradley_terry_loss(torch.tensor([0.0, 1.0, -2.0]), torch.tensor([0.5, 0.8, 0.1]))
    expected = (0.693147 + (0.8 * 0.313262 + 0.2 * 1.313262) + (0.1 * 2.126928 + 0.9 * 0.126928)) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-5)


def test_soft_bt_with_hard_labels_equals_gold_bt():
    margin = torch.tensor([0.3, -1.2, 2.5])
    assert soft_bradley_terry_loss(margin, torch.ones(3)).item() == pytest.approx(bradley_terry_loss(margin).item())


def test_hardening_keeps_the_weak_labels_class_balance():
    margin = torch.tensor([3.0, -1.0, 2.0, 0.0])
    q = torch.tensor([0.9, 0.2, 0.6, 0.3])  # mean 0.5 -> the top 2 of 4 by margin get label 1
    assert hardened_student_labels(margin, q).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert hardened_student_labels(margin, torch.full((4,), 0.76)).tolist() == [1.0, 0.0, 1.0, 1.0]


def test_quantile_hardening_matches_hand_computation():
    # 1 − σ(Δ) = σ(−Δ) = [0.0474, 0.7311, 0.3775, 0.5, 0.1192]; sorted [0.0474, 0.1192, 0.3775, 0.5, 0.7311]
    margin = torch.tensor([3.0, -1.0, 0.5, 0.0, 2.0])
    # mean(q) = 0.7: quantile at position 0.7·4 = 2.8 -> 0.3775 + 0.8·(0.5 − 0.3775) = 0.4755; strictly below it:
    # Δ = 3, 2, 0.5 -> 3 positives, where "top" gives round(0.7·5) = round(3.5) = 4 (half to even): off by one
    q = torch.full((5,), 0.7)
    assert hardened_student_labels(margin, q, "quantile").tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert hardened_student_labels(margin, q, "top").tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]
    # mean(q) = 0.5: position 2.0 -> t = 0.3775 exactly; strict -> Δ = 3, 2 only; "top": round(2.5) = 2, the same
    q = torch.full((5,), 0.5)
    assert hardened_student_labels(margin, q, "quantile").tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert hardened_student_labels(margin, q, "top").tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_quantile_hardening_on_ties_and_a_batch_of_one():
    tied, q = torch.zeros(4), torch.full((4,), 0.5)
    assert hardened_student_labels(tied, q, "quantile").tolist() == [0.0] * 4  # t equals every value: none below
    assert hardened_student_labels(tied, q, "top").sum().item() == 2.0  # exactly round(0.5·4), ties broken by topk
    one, sure = torch.tensor([5.0]), torch.tensor([1.0])
    assert hardened_student_labels(one, sure, "quantile").tolist() == [0.0]
    assert hardened_student_labels(one, sure, "top").tolist() == [1.0]
    with pytest.raises(ValueError, match="hardening"):
        ConfidenceW2S(hardening="median")


def test_confidence_objective_uses_its_hardening_rule():
    margin, q = torch.tensor([3.0, -1.0, 0.5, 0.0, 2.0]), torch.full((5,), 0.7)
    bce = lambda m, t: -(t * math.log(1 / (1 + math.exp(-m))) + (1 - t) * math.log(1 / (1 + math.exp(m))))
    for rule, hard in (("top", [1, 0, 1, 1, 1]), ("quantile", [1, 0, 1, 0, 1])):
        objective = ConfidenceW2S(aux_coef=0.5, warmup_fraction=0.0, hardening=rule)
        expected = sum(bce(m, 0.35 + 0.5 * h) for m, h in zip(margin.tolist(), hard)) / 5
        assert objective(margin, q, progress=0.5).item() == pytest.approx(expected, abs=1e-6)


def test_confidence_loss_matches_hand_computation():
    margin = torch.tensor([3.0, -1.0, 2.0, 0.0])
    q = torch.tensor([0.9, 0.2, 0.6, 0.3])
    # target = 0.5 q + 0.5 [1, 0, 1, 0] = [0.95, 0.1, 0.8, 0.15]
    target = [0.95, 0.1, 0.8, 0.15]
    bce = lambda m, t: -(t * math.log(1 / (1 + math.exp(-m))) + (1 - t) * math.log(1 / (1 + math.exp(m))))
    expected = sum(bce(m, t) for m, t in zip([3.0, -1.0, 2.0, 0.0], target)) / 4
    assert confidence_w2s_loss(margin, q, 0.5).item() == pytest.approx(expected, abs=1e-5)
    assert confidence_w2s_loss(margin, q, 0.0).item() == pytest.approx(soft_bradley_terry_loss(margin, q).item())


def test_confidence_loss_does_not_backpropagate_through_the_hardened_labels():
    margin = torch.tensor([3.0, -1.0, 2.0, 0.0], requires_grad=True)
    q = torch.tensor([0.9, 0.2, 0.6, 0.3])
    confidence_w2s_loss(margin, q, 0.5).backward()
    # d/dΔ BCE(Δ, t) = σ(Δ) - t, divided by the batch size
    expected = (torch.sigmoid(margin.detach()) - torch.tensor([0.95, 0.1, 0.8, 0.15])) / 4
    assert torch.allclose(margin.grad, expected, atol=1e-6)


def test_masked_mse_averages_over_masked_tokens_and_hidden_units():
    hidden = torch.tensor([[[1.0, 2.0], [5.0, 5.0], [0.0, -2.0]]])  # (1, 3, 2)
    mask = torch.tensor([[1, 0, 1]])
    # masked squared errors vs zeros: 1 + 4 + 0 + 4 = 9 over 2 tokens x 2 units
    assert masked_mse(hidden, torch.zeros_like(hidden), mask).item() == pytest.approx(9 / 4)
    assert masked_mse(hidden, hidden.clone(), mask).item() == 0.0
    assert masked_mse(hidden, torch.zeros_like(hidden), torch.zeros(1, 3)).item() == 0.0


def test_reward_centering():
    assert reward_centering_loss(torch.tensor([1.0, -2.0]), torch.tensor([1.0, 0.5])).item() == pytest.approx((4 + 2.25) / 2)


def test_confidence_ramp_shapes():
    lin = ConfidenceW2S(aux_coef=0.5, warmup_fraction=0.2, ramp="linear")
    assert [lin.coef(p) for p in (0.0, 0.1, 0.2, 0.9)] == pytest.approx([0.0, 0.25, 0.5, 0.5])
    cos = ConfidenceW2S(aux_coef=1.0, warmup_fraction=0.5, ramp="cosine")
    assert cos.coef(0.25) == pytest.approx(0.5)
    step = ConfidenceW2S(aux_coef=0.4, warmup_fraction=0.5, ramp="step")
    assert (step.coef(0.49), step.coef(0.5)) == (0.0, 0.4)


def test_objective_registry_and_validation():
    assert {"gold", "naive", "confidence"} <= set(OBJECTIVES)
    assert "seam" not in OBJECTIVES  # SEAM's definition is not available: deliberately absent
    with pytest.raises(ValueError, match="aux_coef"):
        ConfidenceW2S(aux_coef=1.5)
    with pytest.raises(ValueError, match="gold pairs"):
        GoldBradleyTerry()(torch.zeros(2), torch.tensor([1.0, 0.3]), 0.0)
    assert SoftBradleyTerry()(torch.zeros(2), torch.tensor([1.0, 0.0]), 0.0).item() == pytest.approx(math.log(2))


def test_selected_mse_equals_masked_mse_on_the_selected_positions():
    hidden, ref = torch.randn(3, 5, 4), torch.randn(3, 5, 4)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    sel = mask.bool()
    assert selected_mse(hidden[sel], ref[sel]).item() == pytest.approx(masked_mse(hidden, ref, mask).item(), rel=1e-6)
    assert selected_mse(hidden[sel][:0], ref[sel][:0]).item() == 0.0
