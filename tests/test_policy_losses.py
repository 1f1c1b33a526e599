"""Policy-gradient pieces against hand-computed values."""
import math

import pytest
import torch

from lightning_modules.policy.losses import (
    clipped_surrogate, group_advantages, k3_kl, masked_sequence_mean, reinforce_advantages, token_logprobs,
    update_baseline,
)


def test_group_advantages_hand_values():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(r, group_size=4, eps=0.0)
    # group 1: mean 0.25, unbiased std sqrt(((.75)^2 + 3 (.25)^2) / 3) = 0.5
    assert adv[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # all equal -> no signal
    centred = group_advantages(r, group_size=4, scale=False)
    assert centred[:4].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_group_advantages_rejects_ragged():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(8), group_size=3)


def test_reinforce_baseline():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert reinforce_advantages(r, 0.25).tolist() == [0.75, -0.25, 0.75, 0.75]
    b = update_baseline(torch.tensor(0.5), r, momentum=0.9)
    assert float(b) == pytest.approx(0.9 * 0.5 + 0.1 * 0.75)


def test_k3_kl_hand_values():
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.2)])
    kl = k3_kl(logp, ref)
    # d = log(0.25/0.5) = -log 2: exp(d) - d - 1 = 0.5 + log 2 - 1
    assert kl.tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0])
    assert (k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()


def test_token_logprobs_and_masked_mean():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # p(token 2 | pos 0) = 3 / 6
    ids = torch.tensor([[1, 2, 0]])
    lp = token_logprobs(logits, ids)
    assert lp[0].tolist() == pytest.approx([math.log(0.5), math.log(0.25)])
    v = torch.tensor([[1.0, 3.0, 5.0], [2.0, 2.0, 2.0], [7.0, 7.0, 7.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 1], [0, 0, 0]])
    assert float(masked_sequence_mean(v, m)) == pytest.approx((2.0 + 2.0) / 2)  # empty row ignored


def test_clipped_surrogate_values_and_gradient():
    old = torch.zeros(2, 2)
    logp = torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2)
    # row 0: ratios 1.5 (clipped to 1.2 for A > 0) and 1 -> mean 1.1; row 1: min(-0.5, -0.8) = -0.8 and -1 -> -0.9
    assert float(clipped_surrogate(logp, old, adv, mask, 0.2)) == pytest.approx(-(1.1 - 0.9) / 2)
    assert float(clipped_surrogate(logp, old, adv, mask, None)) == pytest.approx(-((1.5 + 1) / 2 + (-0.5 - 1) / 2) / 2)
    # on-policy (ratio 1): gradient = -A / (tokens * sequences) on each masked token
    x = torch.zeros(2, 2, requires_grad=True)
    clipped_surrogate(x, x.detach(), adv, torch.tensor([[1, 0], [1, 1]]), 0.2).backward()
    assert x.grad.flatten().tolist() == pytest.approx([-0.5, 0.0, 0.25, 0.25])
