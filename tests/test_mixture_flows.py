"""Proposition 2.1 simulator: the properties Proposition 2.1 states (docs/policy_mixtures.md)."""
import numpy as np
import pytest

import mixture_fixtures  # noqa: F401  (repository root on sys.path)
from analysis.mixture_flows import fit_time_scale, plot_flows, replicator_flow, softmax_flow

R = [1.0, 1.0, 0.4, 0.0]
W0 = [0.3, 0.2, 0.3, 0.2]


@pytest.mark.parametrize("flow", [softmax_flow, replicator_flow])
def test_suboptimal_weights_vanish(flow):
    t, W = flow(R, W0, t_max=400.0, dt=0.2)
    assert W[0].tolist() == pytest.approx(W0)
    # the softmax flow's logits move at speed w_i, so losers fade like 1/t there, exponentially under replicator
    assert W[-1, 2] < 3e-3 and W[-1, 3] < 2e-3
    assert np.allclose(W.sum(1), 1.0)
    assert (np.diff(W[:, 3]) <= 1e-12).all()  # the worst one decreases monotonically


def test_softmax_flow_amplifies_optimal_asymmetry():
    t, W = softmax_flow(R, W0, t_max=80.0, dt=0.05)
    ratio = W[:, 0] / W[:, 1]
    assert ratio[0] == pytest.approx(1.5)
    assert (np.diff(ratio) > -1e-12).all() and ratio[-1] > 1.5 + 0.1


def test_replicator_flow_keeps_optimal_ratio():
    t, W = replicator_flow(R, W0, t_max=80.0, dt=0.05)
    assert W[:, 0] / W[:, 1] == pytest.approx(np.full(len(t), 1.5), rel=1e-6)
    assert W[-1, 0] == pytest.approx(0.6, abs=0.01)  # 1.5 : 1 split of the surviving mass


def test_bad_inputs():
    with pytest.raises(ValueError, match="sum to 1"):
        softmax_flow([1, 0], [0.7, 0.7], 1.0)
    with pytest.raises(ValueError, match="same length"):
        replicator_flow([1, 0, 0], [0.5, 0.5], 1.0)


def test_fit_time_scale_recovers_scale_and_plots():
    steps = np.arange(0, 50, 5)
    t, W = softmax_flow([1.0, 0.0], [0.5, 0.5], t_max=0.2 * 50, dt=0.01)
    measured = np.stack([np.interp(0.2 * steps, t, W[:, k]) for k in range(2)], 1)
    fit = fit_time_scale([1.0, 0.0], [0.5, 0.5], steps, measured, scales=np.array([0.05, 0.1, 0.2, 0.4]))
    assert fit["scale"] == 0.2 and fit["rmse"] < 1e-3
    fig = plot_flows(R, W0, 10.0, names=["a", "b", "c", "d"])
    assert len(fig.axes) == 2
