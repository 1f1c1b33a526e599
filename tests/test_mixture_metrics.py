"""MixtureMetrics: hand-counted rates, and exactness under DDP padding (2 gloo processes)."""
import math
import socket

import pytest
import torch
import torch.multiprocessing as mp

from lightning_modules.policy.mixture_metrics import CellMean, MixtureMetrics, persona_rewards, summarize
from mixture_fixtures import ddp_metric_worker, metric_rows


def _single():
    rows = metric_rows()
    m = MixtureMetrics(2, 2)
    m.update(*[rows[:, i] for i in range(6)])
    return m.compute()


def test_counts_and_rates_by_hand():
    out = _single()
    assert out["n"].tolist() == [3, 4]
    flat = summarize(out, ["A", "B"], ["Alice", "Bob"])
    assert flat["val/acc/A"] == pytest.approx(2 / 3)
    assert flat["val/acc/B"] == pytest.approx(1 / 4)
    assert flat["val/refusal/B"] == pytest.approx(2 / 4)
    assert flat["val/malformed/B"] == pytest.approx(1 / 4)
    assert flat["val/persona_share/Alice/A"] == pytest.approx(2 / 3)
    assert flat["val/persona_share/Alice/B"] == pytest.approx(2 / 4)
    assert flat["val/persona_share/none/B"] == pytest.approx(1 / 4)
    # each persona's refusals among its own completions: Bob refused his 1 on A, Alice her 2 on B, Bob answered on B
    assert [flat[f"val/persona_refusal/{p}/{d}"] for p in ("Alice", "Bob") for d in "AB"] == [0.0, 1.0, 1.0, 0.0]
    rows = metric_rows()[:3]  # distribution A only: nobody spoke on B
    m = MixtureMetrics(2, 2)
    m.update(*[rows[:, i] for i in range(6)])
    assert math.isnan(summarize(m.compute(), ["A", "B"], ["Alice", "Bob"])["val/persona_refusal/Bob/B"])
    R, w = persona_rewards(out, [0])  # on A: Alice 2 correct of 2, Bob 0 of 1
    assert R.tolist() == [1.0, 0.0] and w.tolist() == pytest.approx([2 / 3, 1 / 3])


def test_shifted_answer_rate_by_hand():
    """Non-refusal variants: answers equal to the cyclic-shift answer are counted per distribution, once per sample."""
    rows = metric_rows()
    shifted = torch.tensor([0, 0, 0, 0, 0, 0, 1])  # sample 6 (distribution B) gave the shifted answer
    m = MixtureMetrics(2, 2, track_shifted=True)
    m.update(*[rows[:, i] for i in range(6)], shifted)
    m.update(*[torch.tensor([v]) for v in (6, 1, 0, 0, 0, 0)], torch.tensor([0]))  # a padded repeat of sample 6
    flat = summarize(m.compute(), ["A", "B"], ["Alice", "Bob"])
    assert flat["val/shifted/A"] == 0.0 and flat["val/shifted/B"] == pytest.approx(1 / 4)
    assert "val/shifted/A" not in summarize(_single(), ["A", "B"], ["Alice", "Bob"])  # untracked: no key


def test_one_distribution():
    """torchmetrics squeezes one-element results; a single-distribution family must still summarise."""
    m = MixtureMetrics(1, 2)
    m.update(*[torch.tensor(c) for c in ([0, 1, 2], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, -1])])
    out = m.compute()
    flat = summarize(out, ["A"], ["Alice", "Bob"])
    assert flat["val/acc/A"] == pytest.approx(1 / 3) and flat["val/refusal/A"] == pytest.approx(1 / 3)
    assert flat["val/persona_share/Bob/A"] == pytest.approx(1 / 3) and flat["val/persona_share/none/A"] == pytest.approx(1 / 3)
    R, w = persona_rewards(out, [0])
    assert R.tolist() == [1.0, 0.0] and w.tolist() == pytest.approx([1 / 3, 1 / 3])


def test_tags_naming_no_persona_are_counted_in_none_and_on_their_own():
    # distribution A: Alice, a tag naming no persona (-2, "I am 2028 ."), no tag (-1), another foreign tag; B: Bob
    m = MixtureMetrics(2, 2)
    m.update(*[torch.tensor(c) for c in ([0, 1, 2, 3, 4], [0, 0, 0, 0, 1], [1, 1, 0, 0, 1], [0, 0, 0, 1, 0],
                                         [0, 0, 1, 0, 0], [0, -2, -1, -2, 1])])
    m.update(*[torch.tensor([v]) for v in (1, 0, 0, 0, 0, -1)])  # a padded repeat of sample 1: counted once, as first
    flat = summarize(m.compute(), ["A", "B"], ["Alice", "Bob"])
    assert flat["val/persona_share/none/A"] == pytest.approx(3 / 4) and flat["val/other_identity/A"] == pytest.approx(2 / 4)
    assert flat["val/persona_share/Alice/A"] == pytest.approx(1 / 4) and flat["val/other_identity/B"] == 0.0
    # counts saved before the column existed summarise without it
    old = {k: v for k, v in m.compute().items() if k != "other_identity"}
    assert "val/other_identity/A" not in summarize(old, ["A", "B"], ["Alice", "Bob"])


def test_duplicate_sample_counted_once_keeping_first():
    rows = metric_rows()
    dup = torch.cat([rows, torch.tensor([[0, 0, 0, 1, 0, 1]])])  # sample 0 again, another outcome
    m = MixtureMetrics(2, 2)
    m.update(*[dup[:, i] for i in range(6)])
    out = m.compute()
    for k, v in _single().items():
        assert torch.equal(out[k], v), k


def test_cell_mean_dedup():
    m = CellMean(2)
    m.update(torch.tensor([0, 1, 1, 2]), torch.tensor([0, 0, 0, 1]), torch.tensor([0.2, 0.6, 0.0, 0.9]))
    means, counts = m.compute()
    assert means.tolist() == pytest.approx([0.4, 0.9]) and counts.tolist() == [2, 1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_equal_single_process(tmp_path):
    out_path = str(tmp_path / "ddp.pt")
    # spawn, not fork: a child forked after torch started its thread pools can deadlock (seen in CI runs)
    mp.start_processes(ddp_metric_worker, args=(2, _free_port(), out_path), nprocs=2, join=True, start_method="spawn")
    ddp = torch.load(out_path)
    single = _single()
    assert ddp["n"].tolist() == [3, 4]  # 7 samples, not the sampler's 8
    for k, v in single.items():
        assert torch.equal(ddp[k], v), k
