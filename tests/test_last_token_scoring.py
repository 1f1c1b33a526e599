"""Last-token scoring (`--model.last_token_scoring`): the last layer runs its queries and MLP at the pooled token
only, yet gives the full forward's rewards and gradients."""
import pytest
import torch
from transformers import AutoConfig, AutoModel

from lightning_modules.reward.heads import pool
from lightning_modules.fast.last_token_scoring import last_token_hidden, supports_last_token_scoring
from tests.helpers import tiny_model


def _masks(ids: torch.Tensor) -> dict:
    right, left = torch.ones_like(ids), torch.ones_like(ids)
    right[1, 5:] = 0
    right[3, 2:] = 0
    left[1, :4] = 0
    left[2, :1] = 0
    return {"right": right, "left": left, "none": torch.ones_like(ids)}


@pytest.mark.parametrize("kind,kv_heads", [("qwen2", 2), ("llama", 1)])
def test_pooled_hidden_state_equals_the_full_forward(kind, kv_heads):
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(kind, vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=kv_heads, pad_token_id=0)
    model = AutoModel.from_config(cfg)
    assert supports_last_token_scoring(model)
    ids = torch.randint(1, 50, (5, 9))
    for side, mask in _masks(ids).items():
        ours = last_token_hidden(model, ids, mask)  # (N, H)
        ref = pool(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask, "last")
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0, msg=side)


@pytest.mark.parametrize("buckets", [1, 3])
def test_module_rewards_and_gradients_match_the_full_forward(word_tokenizer_dir, buckets):
    torch.manual_seed(0)
    model = tiny_model(word_tokenizer_dir, length_buckets=buckets)
    assert model.last_token_scoring  # the default
    lengths = [30, 70, 50, 60, 9, 20]
    ids = torch.randint(5, 50, (len(lengths), 70))
    mask = (torch.arange(70)[None] < torch.tensor(lengths)[:, None]).long()  # right padded, as the collator
    ids = ids.masked_fill(mask == 0, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    fast, _ = model(ids, mask)
    g_fast = torch.autograd.grad(fast.pow(2).sum(), params)
    model.last_token_scoring = False
    full, _ = model(ids, mask)
    g_full = torch.autograd.grad(full.pow(2).sum(), params)
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
    assert fast.std() > 0  # distinct rewards: the comparison sees each row
    for a, b in zip(g_fast, g_full):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_other_backbones_and_mean_pooling_use_the_full_forward(word_tokenizer_dir):
    gpt2 = tiny_model(word_tokenizer_dir, backbone="tiny-gpt2")
    assert not supports_last_token_scoring(gpt2.backbone)
    mean = tiny_model(word_tokenizer_dir, pooling="mean")
    ids = torch.randint(5, 50, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    with torch.no_grad():
        ref = mean.head(mean.backbone(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
        torch.testing.assert_close(mean(ids, mask)[0], ref)
        checkpointed = tiny_model(word_tokenizer_dir, gradient_checkpointing=True)
    assert not supports_last_token_scoring(checkpointed.backbone)
