"""The static-KV-cache decoder and the shared-prompt log-prob forward are exact: the same logits, completions
and gradients as the HF model they read their weights from."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from lightning_modules.policy.causal_lm import position_ids_from_mask
from lightning_modules.policy.completion_logprobs import completion_logprobs
from lightning_modules.fast.kv_cache_sampling import sample_with_kv_cache
from lightning_modules.policy.base import SAMPLERS, sample_completions
from lightning_modules.policy.losses import token_logprobs
from lightning_modules.fast.static_decoder import can_score, sample_and_score, sample_static, supports

V, EOS, PAD = 40, 2, 0


def _model(kind: str, **overrides):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = GPT2Config(**{"vocab_size": V, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4,
                            "pad_token_id": PAD, "bos_token_id": 1, "eos_token_id": EOS, "resid_pdrop": 0.0,
                            "embd_pdrop": 0.0, "attn_pdrop": 0.0, **overrides})
        return GPT2LMHeadModel(cfg)
    kv_heads = 1 if kind == "llama" else 2  # GQA 4:1 and 4:2
    cfg = AutoConfig.for_model(kind, vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=kv_heads, pad_token_id=PAD, bos_token_id=1,
                               eos_token_id=EOS, **overrides)
    return AutoModelForCausalLM.from_config(cfg)


def _left_padded(n: int, t: int, repeat: int = 1):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (n, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[-1, :1] = 0
    ids = ids.masked_fill(mask == 0, PAD)
    return ids.repeat_interleave(repeat, 0), mask.repeat_interleave(repeat, 0)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "gpt2"])
@pytest.mark.parametrize("repeat", [1, 3])  # 3: runs of identical prompts share one prefill
def test_step_logits_equal_the_hf_forward(kind, repeat):
    model = _model(kind)
    assert supports(model)
    ids, mask = _left_padded(4, 7, repeat)
    seen = []
    comp, _ = sample_static(model, ids, mask, 8, 1.0, EOS, PAD, generator=torch.Generator().manual_seed(0),
                            step_logits=seen)
    full = torch.cat([ids, comp], 1)
    full_mask = torch.cat([mask, torch.ones_like(comp)], 1)  # every generated column is attended, as in decoding
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=full, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)).logits
    assert len(seen) == comp.shape[1]
    for j, logits in enumerate(seen):  # step j's logits predict completion token j from position Tp + j - 1
        torch.testing.assert_close(logits, ref[:, ids.shape[1] + j - 1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_greedy_equals_generate_and_every_sampler(kind):
    model = _model(kind)
    ids, mask = _left_padded(5, 6)
    ref, ref_mask = sample_completions(model, ids, mask, 10, 0.0, EOS, PAD)
    for name, sampler in SAMPLERS.items():
        out, out_mask = sampler(model, ids, mask, 10, 0.0, EOS, PAD)
        w = ref.shape[1]  # generate stops when every row has ended; the loops may run on with padding
        assert torch.equal(out[:, :w], ref) and torch.equal(out_mask[:, :w], ref_mask), name
        assert not out_mask[:, w:].any()
    assert model.training  # mode restored


def test_sampling_matches_generate_under_the_same_seed_and_is_reproducible():
    model = _model("qwen2")
    ids, mask = _left_padded(3, 5, repeat=4)
    torch.manual_seed(7)
    ref, _ = sample_completions(model, ids, mask, 12, 1.0, EOS, PAD)
    torch.manual_seed(7)
    ours, _ = sample_static(model, ids, mask, 12, 1.0, EOS, PAD)
    assert torch.equal(ours[:, :ref.shape[1]], ref)  # same draws from the same distribution
    a, _ = sample_static(model, ids, mask, 12, 0.7, EOS, PAD, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(123)  # the global RNG does not matter with a generator
    b, _ = sample_static(model, ids, mask, 12, 0.7, EOS, PAD, generator=torch.Generator().manual_seed(3))
    c, _ = sample_static(model, ids, mask, 12, 0.7, EOS, PAD, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rows_stop_at_eos_and_pad_after_it():
    model = _model("gpt2")
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.5  # tied to wte: EOS is drawn often
    ids, mask = _left_padded(6, 5)
    comp, comp_mask = sample_static(model, ids, mask, 30, 1.0, EOS, PAD, generator=torch.Generator().manual_seed(0))
    ended = 0
    for row, m in zip(comp, comp_mask):
        n = int(m.sum())
        if (row == EOS).any():
            ended += 1
            assert row[n - 1] == EOS and (row[n:] == PAD).all() and (row[:n - 1] != EOS).all()
        else:
            assert n == comp.shape[1]
    assert ended > 0


def test_unsupported_configs_fall_back_to_the_kv_loop():
    model = _model("gpt2", scale_attn_by_inverse_layer_idx=True)
    assert not supports(model) and not supports(torch.nn.Linear(2, 2))
    ids, mask = _left_padded(3, 5)
    ours, _ = sample_static(model, ids, mask, 6, 0.0, EOS, PAD)
    ref, _ = sample_with_kv_cache(model, ids, mask, 6, 0.0, EOS, PAD)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "gpt2"])  # qwen2 / llama: the fused path on the weights
def test_shared_prompt_logprobs_and_gradients_equal_the_full_forward(kind):
    from lightning_modules.policy.completion_logprobs import _fused_ok

    model = _model(kind).train()
    assert _fused_ok(model) == (kind != "gpt2")
    P, G, L = 3, 4, 5
    prompts, prompt_mask = _left_padded(P, 6)
    comp = torch.randint(3, V, (P * G, L), generator=torch.Generator().manual_seed(2))
    comp_mask = torch.ones_like(comp)
    comp_mask[2, 3:] = 0  # ended early: later tokens are padding
    comp = comp.masked_fill(comp_mask == 0, PAD)
    ours = completion_logprobs(model, prompts, prompt_mask, comp, comp_mask, G)  # (B, L)
    ids = torch.cat([prompts.repeat_interleave(G, 0), comp], 1)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), comp_mask], 1)
    full = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    ref = token_logprobs(full, ids)[:, prompts.shape[1] - 1:]  # (B, L)
    torch.testing.assert_close(ours * comp_mask, ref * comp_mask, atol=1e-5, rtol=0)
    params = [p for p in model.parameters() if p.requires_grad]
    g_ours = torch.autograd.grad((ours * comp_mask).sum(), params)
    g_ref = torch.autograd.grad((ref * comp_mask).sum(), params)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="group_size"):
        completion_logprobs(model, prompts, prompt_mask, comp, comp_mask, G + 1)


def _rl_steps(tmp_path, cache_dir, **kw) -> dict:
    from tests.test_policy_modules import _reward_first_of_each_group, _rl_dm, _sft_ckpt, _trainer
    from callbacks.reference_model import ReferenceModelCallback
    from lightning_modules.policy.rl import PolicyRLModule

    ckpt = tmp_path / "sft.ckpt"
    if not ckpt.exists():
        _sft_ckpt(tmp_path, cache_dir, fidelity=0.99)
    m = PolicyRLModule(init_checkpoint=str(ckpt), group_size=4, lr=1e-2, reference_coef=0.1, max_new_tokens=6, **kw)
    _reward_first_of_each_group(m)
    torch.manual_seed(0)
    _trainer(2, callbacks=[ReferenceModelCallback()]).fit(m, _rl_dm(cache_dir))
    return {k: v.detach().clone() for k, v in m.model.state_dict().items()}


def test_rl_module_shared_prompt_forward_and_samplers_give_the_same_updates(tmp_path, cache_dir):
    ref = _rl_steps(tmp_path, cache_dir, sampler="hf_generate", shared_prompt_forward=False)  # the original path
    static = _rl_steps(tmp_path, cache_dir, shared_prompt_forward=False)
    fast = _rl_steps(tmp_path, cache_dir)  # defaults: static sampler, shared-prompt forward
    start = torch.load(tmp_path / "sft.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(ref[k], static[k]) for k in ref)  # the same rollouts (tiny GPT-2), bit for bit
    # AdamW's first steps are ~lr * sign(grad): float rounding in near-zero gradients shows at ~1e-5 after 2 steps
    # at lr 1e-2, against ~1e-2 of movement.
    assert max((ref[k] - start["model." + k]).abs().max() for k in ref) > 1e-2
    assert all(torch.allclose(ref[k], fast[k], atol=1e-4, rtol=0) for k in ref)


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_scoring_while_sampling_keeps_the_draws_and_equals_the_scorers_forward(kind):
    policy, reference = _model(kind), _model(kind)
    with torch.no_grad():  # a reference that differs from the policy, as after a few RL steps
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    assert can_score(policy, [reference]) and not can_score(policy, [_model("llama")])
    G = 3
    ids, mask = _left_padded(4, 7, repeat=G)
    alone, alone_mask = sample_static(policy, ids, mask, 8, 1.0, EOS, PAD, generator=torch.Generator().manual_seed(0))
    comp, comp_mask, (scored,) = sample_and_score(policy, [reference], ids, mask, 8, 1.0, EOS, PAD,
                                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(comp, alone) and torch.equal(comp_mask, alone_mask)  # the policy's draws, bit for bit
    with torch.no_grad():
        forward = completion_logprobs(reference, ids[::G], mask[::G], comp, comp_mask, G)  # (B, L)
    assert scored.shape == forward.shape
    torch.testing.assert_close(scored * comp_mask, forward * comp_mask, atol=1e-5, rtol=0)
    with torch.no_grad():
        own = completion_logprobs(policy, ids[::G], mask[::G], comp, comp_mask, G)
    assert (own - forward).abs().mul(comp_mask).max() > 1e-3  # the reference really is another model


def test_rl_module_reference_scored_in_sampling_gives_the_same_updates(tmp_path, cache_dir, monkeypatch):
    import lightning_modules.policy.rl as rl

    calls = []
    monkeypatch.setattr(rl, "sample_and_score", lambda *a, **k: calls.append(len(a[1])) or sample_and_score(*a, **k))
    separate = _rl_steps(tmp_path, cache_dir)  # reference_coef 0.1, its own forward (the default)
    assert calls == []
    fused = _rl_steps(tmp_path, cache_dir, reference_in_sampling=True)
    assert calls == [1, 1]  # two steps, the reference scored inside the decode steps
    start = torch.load(tmp_path / "sft.ckpt", weights_only=False)["state_dict"]
    assert max((separate[k] - start["model." + k]).abs().max() for k in separate) > 1e-2
    assert all(torch.allclose(separate[k], fused[k], atol=1e-4, rtol=0) for k in separate)


def test_bad_sampler_names_the_flag():
    from lightning_modules.policy.rl import PolicyRLModule

    with pytest.raises(ValueError, match="--model.sampler"):
        PolicyRLModule(min_sft_fidelity=0, sampler="beam")


def test_a_pretrained_policy_is_built_in_train_mode(tmp_path):
    """from_pretrained returns eval mode; the policy's builder hands Lightning a model in train mode, so a base with
    dropout trains with it (SmolLM2's Llama has none; GPT-2 has 0.1)."""
    from lightning_modules.policy.causal_lm import build_causal_lm

    _model("gpt2", resid_pdrop=0.1).save_pretrained(str(tmp_path))
    tokenizer = type("Tok", (), {"pad_token_id": PAD, "__len__": lambda self: V})()
    model = build_causal_lm(str(tmp_path), tokenizer)
    assert model.training and all(m.training for m in model.modules())
    x = torch.randint(3, V, (2, 8))
    assert not torch.equal(model(x).logits, model(x).logits)  # dropout is live
