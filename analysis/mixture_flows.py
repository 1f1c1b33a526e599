"""Proposition 2.1 (docs/policy_mixtures.md): what RL does to the weights of a mixture of fixed policies.

pi_w = sum_i w_i pi_i, J(w) = sum_i w_i R_i.
- softmax-logit gradient flow: w = softmax(theta), d theta_i / dt = w_i (R_i - J)  (gradient ascent on theta)
- replicator flow on the simplex: d w_i / dt = w_i (R_i - J)
Under both, components with R_i < max R go to 0. Among optimal components the softmax flow amplifies the initial
asymmetry (d(theta_i - theta_k)/dt = (w_i - w_k)(R* - J)), the replicator flow keeps w_i / w_k constant.

The bridge to an RL run: estimate R_i (each persona's mean reward on the training distributions) and the initial
shares w(0) from the first evaluation, integrate the softmax flow, and fit one time scale (flow time per RL step)
to the measured persona shares -- `fit_time_scale` / `overlay_figure`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def _softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max())
    return z / z.sum()


def _check(R: Sequence[float], w0: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    R, w0 = np.asarray(R, dtype=float), np.asarray(w0, dtype=float)
    if R.shape != w0.shape or R.ndim != 1:
        raise ValueError(f"R and w0 must be vectors of the same length, got {R.shape} and {w0.shape}")
    if (w0 <= 0).any() or abs(w0.sum() - 1) > 1e-6:
        raise ValueError(f"w0 must be strictly positive and sum to 1, got {w0.tolist()}")
    return R, w0


def _rk4(f, x0: np.ndarray, t_max: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
    n = int(np.ceil(t_max / dt))
    xs = np.empty((n + 1, len(x0)))
    xs[0] = x = x0.copy()
    for i in range(n):
        k1 = f(x)
        k2 = f(x + dt / 2 * k1)
        k3 = f(x + dt / 2 * k2)
        k4 = f(x + dt * k3)
        xs[i + 1] = x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return np.arange(n + 1) * dt, xs


def softmax_flow(R: Sequence[float], w0: Sequence[float], t_max: float, dt: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """Times (n,) and weights (n, K) of the softmax-logit gradient flow from theta(0) = log w0."""
    R, w0 = _check(R, w0)

    def f(theta):
        w = _softmax(theta)
        return w * (R - w @ R)

    t, thetas = _rk4(f, np.log(w0), t_max, dt)
    return t, np.stack([_softmax(th) for th in thetas])


def replicator_flow(R: Sequence[float], w0: Sequence[float], t_max: float, dt: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """Times (n,) and weights (n, K) of the replicator flow (renormalised against integration drift)."""
    R, w0 = _check(R, w0)

    def f(w):
        return w * (R - w @ R)

    t, ws = _rk4(f, w0, t_max, dt)
    ws = np.clip(ws, 0, None)
    return t, ws / ws.sum(axis=1, keepdims=True)


def plot_flows(R: Sequence[float], w0: Sequence[float], t_max: float, names: Optional[Sequence[str]] = None):
    """Figure with the two flows side by side (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(names) if names is not None else [f"pi_{i}" for i in range(len(R))]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, (title, flow) in zip(axes, (("softmax-logit gradient flow", softmax_flow), ("replicator flow", replicator_flow))):
        t, W = flow(R, w0, t_max)
        for k, name in enumerate(names):
            ax.plot(t, W[:, k], label=f"{name} (R={R[k]:.2f})")
        ax.set_title(title)
        ax.set_xlabel("t")
    axes[0].set_ylabel("weight w_i")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def fit_time_scale(R: Sequence[float], w0: Sequence[float], steps: Sequence[float], measured: np.ndarray,
                   scales: Optional[np.ndarray] = None) -> dict:
    """Fit c (flow time per RL step) so that softmax_flow(c * step) matches measured shares (S, K).

    Returns {"scale", "rmse", "predicted" (S, K)}; shares are renormalised over the K personas.
    """
    steps = np.asarray(steps, dtype=float)
    measured = np.asarray(measured, dtype=float)
    measured = measured / np.clip(measured.sum(axis=1, keepdims=True), 1e-12, None)
    scales = np.logspace(-3, 2, 31) if scales is None else scales
    best = None
    for c in scales:
        t_max = max(c * steps.max(), 1e-6)
        dt = t_max / 200
        t, W = softmax_flow(R, w0, t_max, dt)
        pred = np.stack([np.interp(c * steps, t, W[:, k]) for k in range(W.shape[1])], axis=1)
        rmse = float(np.sqrt(np.mean((pred - measured) ** 2)))
        if best is None or rmse < best["rmse"]:
            best = {"scale": float(c), "rmse": rmse, "predicted": pred}
    return best


def overlay_figure(steps: Sequence[float], measured: np.ndarray, R: Sequence[float], w0: Sequence[float], scale: float,
                   names: Sequence[str], top: int = 6):
    """Measured persona shares (markers) over RL steps vs the softmax flow's prediction (lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.asarray(steps, dtype=float)
    t, W = softmax_flow(R, w0, max(scale * steps.max(), 1e-6), max(scale * steps.max(), 1e-6) / 400)
    keep = np.argsort(-np.maximum(np.asarray(measured).max(0), W.max(0)))[:top]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for k in keep:
        line, = ax.plot(t / scale, W[:, k], label=f"{names[k]} predicted (R={R[k]:.2f})")
        ax.plot(steps, np.asarray(measured)[:, k], "o", color=line.get_color(), label=f"{names[k]} measured")
    ax.set_xlabel("RL step")
    ax.set_ylabel("persona share on the training distributions")
    ax.set_title(f"Prop. 2.1 softmax flow vs RL (fitted c = {scale:.3g} per step)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
