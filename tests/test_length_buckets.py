"""Length-bucketed scoring (`--model.length_buckets`) and the fast tokenized columns: same values, less padding."""
import datasets
import pytest
import torch

from datamodules.preference.columns import RaggedColumn, fast_column, value_counts
from lightning_modules.fast.length_buckets import (bucketed_positions, bucketed_scores, is_right_padded, plan_buckets,
                                                   processed_positions)
from tests.helpers import tiny_data, tiny_model


def test_plan_covers_every_row_once_longest_first():
    lengths = [5, 50, 7, 48, 30, 6, 49, 31]
    groups = plan_buckets(lengths, max_buckets=3, forward_cost=1.0)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert len(groups) == 3
    assert [[lengths[i] for i in g] for g in groups] == [[50, 49, 48], [31, 30], [7, 6, 5]]
    assert processed_positions(lengths, 3, forward_cost=1.0) == 3 * 50 + 2 * 31 + 3 * 7
    assert processed_positions(lengths, 1) == 8 * 50


def test_plan_keeps_one_forward_when_a_forward_costs_more_than_the_padding():
    assert len(plan_buckets([10, 9, 8, 7], max_buckets=4, forward_cost=1000.0)) == 1
    assert plan_buckets([3, 1, 2], max_buckets=1) == [[0, 2, 1]]


def test_right_padding_detection():
    assert is_right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert not is_right_padded(torch.tensor([[0, 1, 1], [1, 1, 1]]))


def test_bucketed_scores_equal_one_padded_forward(word_tokenizer_dir):
    torch.manual_seed(0)
    model = tiny_model(word_tokenizer_dir).eval()
    lengths = [30, 170, 50, 160, 90, 20, 150, 80]
    ids = torch.randint(5, 50, (len(lengths), 170))
    mask = (torch.arange(170)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        padded, _ = model(ids, mask)
        model.length_buckets = 4
        bucketed, _ = model(ids, mask)
    torch.testing.assert_close(bucketed, padded, rtol=1e-5, atol=1e-5)
    calls = []

    def score(i, m):
        calls.append(tuple(i.shape))
        return m.sum(1).float()

    out = bucketed_scores(score, ids, mask, 4)
    assert out.tolist() == [float(n) for n in lengths]  # rows come back in their order
    assert len(calls) > 1 and sum(r * t for r, t in calls) < ids.numel()
    calls.clear()
    assert bucketed_scores(score, ids.flip(1), mask.flip(1), 4).tolist() == out.tolist()  # left padding
    assert calls == [tuple(ids.shape)]  # ... falls back to one forward


def test_bucketed_training_gives_the_same_gradients(word_tokenizer_dir):
    grads = []
    for buckets in (1, 3):
        torch.manual_seed(0)
        model = tiny_model(word_tokenizer_dir, length_buckets=buckets)
        lengths = torch.tensor([40, 120, 70, 110, 30, 120])
        ids = torch.randint(5, 50, (6, 120))
        mask = (torch.arange(120)[None] < lengths[:, None]).long()
        rewards, _ = model(ids, mask)
        rewards.square().sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    # fp32 sums in another order: tolerances relative to the gradient's scale (an entry near 0 moved by 1.2e-6 once)
    scale = float(grads[0].abs().max())
    assert scale > 1e-3, scale
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-7 * scale)


def test_bucketed_positions_equal_one_call_at_real_positions_with_zeros_elsewhere():
    torch.manual_seed(0)
    lengths = [9, 2, 7, 3, 9, 5]
    mask = (torch.arange(9).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()  # (6, 9), right-padded
    h = torch.randn(6, 9, 4, requires_grad=True)
    w = torch.randn(4, 4)

    def fn(x, m):  # per-position outputs that depend on the row's real positions only, like a masked layer
        pooled = (x * m.unsqueeze(-1)).sum(1, keepdim=True) / m.sum(1).view(-1, 1, 1)  # (n, 1, 4)
        return (x @ w + pooled, None, m.float())

    plain = fn(h, mask)
    calls = []
    out = bucketed_positions(lambda x, m: calls.append(x.shape) or fn(x, m), h, mask, max_buckets=3, forward_cost=0)
    assert len(calls) == 3 and sorted(c[1] for c in calls) == [3, 7, 9]  # each bucket trimmed to its longest row
    real = mask.bool()
    torch.testing.assert_close(out[0][real], plain[0][real])
    assert out[1] is None and torch.equal(out[2], mask.float())
    grad = torch.autograd.grad(out[0][real].sum(), h)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(plain[0][real].sum(), h)[0])


def test_length_buckets_flag_is_validated(word_tokenizer_dir):
    with pytest.raises(ValueError, match="--model.length_buckets"):
        tiny_model(word_tokenizer_dir, length_buckets=0)


def test_fast_column_matches_datasets_after_filter():
    ds = datasets.Dataset.from_dict({"ids": [[1, 2], [], [3, 4, 5], [6]], "n": [2, 0, 3, 1]})
    ds = ds.filter(lambda n: n != 3, input_columns="n")
    col = fast_column(ds, "ids")
    assert isinstance(col, RaggedColumn) and len(col) == 3
    assert [col[i] for i in range(3)] == [[1, 2], [], [6]] and col[-1] == [6]
    assert fast_column(ds, "n") == [2, 0, 1]
    with pytest.raises(IndexError):
        col[3]


def test_value_counts_in_arrow_respect_the_indices_mapping():
    ds = datasets.Dataset.from_dict({"status": ["ok", "dropped_too_long", "ok", "truncated", "ok"], "n": [0, 1, 2, 3, 4]})
    assert value_counts(ds, "status") == {"ok": 3, "dropped_too_long": 1, "truncated": 1}
    kept = ds.filter(lambda n: n >= 2, input_columns="n")  # an indices mapping over the same table
    assert value_counts(kept, "status") == {"ok": 2, "truncated": 1}
    assert value_counts(ds.select([]), "status") == {}


def test_train_subset_all_with_length_grouping(word_tokenizer_dir, cache_dir):
    dm = tiny_data(word_tokenizer_dir, cache_dir, train_subset="all", length_grouped=True)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert sum(len(b["labels"]) for b in batches) == len(dm._train_set())
