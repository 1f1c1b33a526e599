"""Pooling, collation and tokenization against literal tensors."""
import pytest
import torch

from datamodules.preference.collate import PairCollator
from datamodules.preference.pair_tokenization import PairTokenizer, render_prompt
from datamodules.preference.samplers import LengthGroupedSampler
from lightning_modules.reward.heads import RewardHead, last_token_index, pool


def test_last_token_index_right_and_left_padding():
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert last_token_index(right).tolist() == [2, 4, 0]
    assert last_token_index(left).tolist() == [4, 4, 4]


def test_pooling_reads_the_same_token_whatever_the_padding_side():
    h = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert pool(h, right, "last").tolist() == [h[0, 1].tolist(), h[1, 3].tolist()]
    assert pool(h, right, "mean")[0].tolist() == ((h[0, 0] + h[0, 1]) / 2).tolist()
    head = RewardHead(3, "last")
    shifted = torch.zeros_like(h)
    shifted[0, 2:] = h[0, :2]  # the same first sequence, left-padded
    shifted[1] = h[1]
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert torch.allclose(head(h, right), head(shifted, left))


@pytest.mark.parametrize("side", ["right", "left"])
def test_collator_pads_a_then_b_in_one_batch(side):
    examples = [
        {"a_input_ids": [5, 6, 7], "a_response_start": 2, "b_input_ids": [5, 6, 8, 9], "b_response_start": 2,
         "index": 3, "label": 0.7},
        {"a_input_ids": [4, 7], "a_response_start": 1, "b_input_ids": [4, 9], "b_response_start": 1, "index": 0},
    ]
    batch = PairCollator(pad_token_id=0, padding_side=side)(examples)
    if side == "right":
        ids = [[5, 6, 7, 0], [4, 7, 0, 0], [5, 6, 8, 9], [4, 9, 0, 0]]
        resp = [[0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 1, 1], [0, 1, 0, 0]]
    else:
        ids = [[0, 5, 6, 7], [0, 0, 4, 7], [5, 6, 8, 9], [0, 0, 4, 9]]
        resp = [[0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 1]]
    assert batch["input_ids"].tolist() == ids
    assert batch["attention_mask"].tolist() == [[int(t != 0) for t in row] for row in ids]
    assert batch["response_mask"].tolist() == resp
    assert batch["labels"].tolist() == pytest.approx([0.7, 1.0])
    assert batch["index"].tolist() == [3, 0]


def _tok(word_tokenizer_dir):
    from datamodules.tokenizers import load_tokenizer

    return load_tokenizer(word_tokenizer_dir)


def test_plain_format_and_response_boundary(word_tokenizer_dir):
    tok = _tok(word_tokenizer_dir)
    prompt = [{"role": "user", "content": "hello how are you"}]
    assert render_prompt(tok, prompt) == "user: hello how are you\nassistant:"
    out = PairTokenizer(tok, max_length=64)({"prompt": [prompt], "chosen": ["fine"], "rejected": ["bad bad"]})
    a, start = out["a_input_ids"][0], out["a_response_start"][0]
    assert tok.convert_ids_to_tokens(a) == ["<s>", "user", ":", "hello", "how", "are", "you", "assistant", ":",
                                             "fine", "</s>"]
    assert start == 9 and out["b_response_start"][0] == 9
    assert tok.convert_ids_to_tokens(out["b_input_ids"][0][start:]) == ["bad", "bad", "</s>"]
    assert out["status"] == ["ok"]


def test_keep_response_truncation_cuts_the_oldest_prompt_tokens(word_tokenizer_dir):
    tok = _tok(word_tokenizer_dir)
    prompt = [{"role": "user", "content": " ".join(["hello"] * 30) + " you"}]
    pt = PairTokenizer(tok, max_length=20, truncation="keep_response")
    out = pt({"prompt": [prompt], "chosen": ["fine good"], "rejected": ["bad"]})
    a = tok.convert_ids_to_tokens(out["a_input_ids"][0])
    assert len(a) == 20 and a[0] == "<s>" and a[-3:] == ["fine", "good", "</s>"]
    assert a[-6:-3] == ["you", "assistant", ":"]  # the newest context survives
    assert out["status"] == ["truncated_prompt"]
    long = pt({"prompt": [prompt], "chosen": [" ".join(["fine"] * 40)], "rejected": ["bad"]})
    assert long["status"] == ["truncated_response"] and len(long["a_input_ids"][0]) == 20
    dropped = PairTokenizer(tok, max_length=20, truncation="drop")({"prompt": [prompt], "chosen": ["x"], "rejected": ["y"]})
    assert dropped["status"] == ["dropped_too_long"]


def test_length_grouped_sampler_is_a_seeded_grouped_permutation():
    lengths = [((i * 37) % 101) for i in range(200)]
    s = LengthGroupedSampler(lengths, batch_size=10, chunk_batches=5, seed=1)
    s.set_epoch(0)
    first = list(s)
    assert sorted(first) == list(range(200))
    s.set_epoch(0)
    assert list(s) == first
    s.set_epoch(1)
    assert list(s) != first
    batches = [first[i:i + 10] for i in range(0, 200, 10)]
    spread = sum(max(lengths[j] for j in b) - min(lengths[j] for j in b) for b in batches) / len(batches)
    assert spread < 25  # random batches of these lengths spread over ~85
