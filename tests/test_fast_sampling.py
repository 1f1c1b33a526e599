"""The lean KV-cache sampler agrees with HF `generate` (greedy) and keeps the completion-mask contract."""
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lightning_modules.fast.kv_cache_sampling import sample_with_kv_cache
from lightning_modules.policy.base import sample_completions


def _model():
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("qwen2", vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                               eos_token_id=2)
    return AutoModelForCausalLM.from_config(cfg)


def test_greedy_matches_generate_and_masks_after_eos():
    model = _model()
    ids = torch.randint(3, 40, (5, 7))
    mask = torch.ones_like(ids)
    ours, ours_mask = sample_with_kv_cache(model, ids, mask, 9, 0.0, eos_id=2, pad_id=0)
    ref, ref_mask = sample_completions(model, ids, mask, 9, 0.0, eos_id=2, pad_id=0)
    width = ref.shape[1]
    assert torch.equal(ours[:, :width], ref) and torch.equal(ours_mask[:, :width], ref_mask)
    assert model.training  # mode restored


def test_sampling_stops_rows_at_eos():
    model = _model()
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[2] = 0.0
    torch.manual_seed(1)
    ids = torch.randint(3, 40, (4, 5))
    comp, comp_mask = sample_with_kv_cache(model, ids, torch.ones_like(ids), 30, 1.0, eos_id=2, pad_id=0)
    for row, m in zip(comp, comp_mask):
        n = int(m.sum())
        if (row == 2).any():
            assert row[n - 1] == 2 and (row[n:] == 0).all()
        else:
            assert n == comp.shape[1]
