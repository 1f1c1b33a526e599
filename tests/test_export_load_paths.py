"""The load paths the README promises for exported reward models (issue 47), checked on the scores.

- A decoder reward model (last-token head) loads with plain `AutoModelForSequenceClassification.from_pretrained(D)`
  and `pipeline("text-classification", model=D, function_to_apply="none")`, and a TRL-style conversation (the
  prompt's messages + the response as an assistant turn) through the exported tokenizer's chat template gives
  exactly the project's input layout and scores. Tiny random Llama with a ChatML template (SmolLM2's shape).
  The same without a chat template (word-level tokenizers, GPT-2 with pad = EOS): the plain format.
- A mean-pooled encoder (the shipped MiniLM) never loads with a random head: without `trust_remote_code=True`
  `AutoModelForSequenceClassification` raises (with or without `num_labels=1`); with it, the trained pooling and
  head score like the module, also through the pipeline on text pairs.
- Slow: a SmolLM2-135M-Instruct reward model fitted 2 steps, exported, loaded the same ways.
"""
import os
import time

import pytest
import torch

from cli import main
from datamodules.preference.pair_tokenization import PairTokenizer, render_prompt
from datamodules.tokenizers import load_tokenizer
from lightning_modules.export.reward_model import conversation, conversation_probe_pairs, pad_rows
from lightning_modules.reward.reward_model import RewardModelModule
from tests.test_export import fixture_pairs
from tests.test_export_policy_chat import chat_llama  # noqa: F401  (the fixture: a tiny ChatML Llama)


def export_module(module: RewardModelModule, root) -> str:
    """Save `module` as a checkpoint and export it with `cli.py export`; returns the directory."""
    ckpt, out = str(root / "rm.ckpt"), str(root / "rm")
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, ckpt)
    main(["export", "--ckpt_path", ckpt, "--out_dir", out])
    return out


@torch.no_grad()
def project_scores(module: RewardModelModule, pairs: list[dict]) -> tuple[list[list[int]], torch.Tensor]:
    """Our ids and rewards, chosen then rejected per pair, one unpadded row at a time."""
    module.eval()
    tok = load_tokenizer(module.tokenizer_name)
    enc = PairTokenizer(tok, max_length=10**6)({k: [p[k] for p in pairs] for k in ("prompt", "chosen", "rejected")})
    rows = [r for ab in zip(enc["a_input_ids"], enc["b_input_ids"]) for r in ab]
    return rows, torch.cat([module(*pad_rows([r], tok.pad_token_id, "right"))[0] for r in rows])


def conversations(pairs: list[dict]) -> list[list[dict]]:
    return [conversation(p, k) for p in pairs for k in ("chosen", "rejected")]


def test_decoder_reward_model_loads_with_plain_transformers_and_scores_conversations(chat_llama, tmp_path):  # noqa: F811
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    torch.manual_seed(0)
    module = RewardModelModule(backbone=chat_llama, tokenizer=chat_llama)
    out = export_module(module, tmp_path)
    pairs = fixture_pairs() + conversation_probe_pairs()  # 12 pairs: multi-turn hub prompts, a system turn
    rows, want = project_scores(module, pairs)
    assert want.std() > 1e-3

    tok = AutoTokenizer.from_pretrained(out)
    rm = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(rm).__name__ == "LlamaForSequenceClassification" and rm.config.num_labels == 1
    ids = [tok.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"] for c in conversations(pairs)]
    assert [list(i) for i in ids] == rows  # the conversation gives exactly the project's layout
    with torch.no_grad():
        got = torch.cat([rm(input_ids=torch.tensor([i])).logits[:, 0] for i in ids])
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()

    classify = pipeline("text-classification", model=out, function_to_apply="none")
    texts = [tok.apply_chat_template(c, tokenize=False) for c in conversations(pairs)]
    piped = torch.tensor([o["score"] for o in classify(texts)])
    assert torch.allclose(piped, want, atol=1e-5, rtol=0), (piped - want).abs().max()

    # prompts alone render as before (what `hf_classifier:<export>` and the card's reward_input read) ...
    base = load_tokenizer(chat_llama)
    assert all(render_prompt(tok, p["prompt"]) == render_prompt(base, p["prompt"]) for p in pairs)
    # ... while the base template's own rendering of the whole conversation (a closing "<|im_end|>\n") scores another
    # token: the difference the exported template removes
    plain = base.apply_chat_template(conversations(pairs)[0], tokenize=True, return_dict=True)["input_ids"]
    assert list(plain) != rows[0] and list(plain)[:-1] == rows[0]
    card = open(os.path.join(out, "README.md")).read()
    assert "TRL-style conversations score the same" in card and "on 6 conversations through" in card


def test_a_template_that_misses_the_layout_is_not_installed(chat_llama, tmp_path, monkeypatch):  # noqa: F811
    """When the conversation template does not reproduce our ids on the probe conversations, the export keeps the
    original template and its card says conversations must go through `reward_input`."""
    import lightning_modules.export.reward_model as rm

    monkeypatch.setattr(rm, "conversation_template", lambda tok: tok.chat_template)  # ChatML's own: a trailing "\n"
    torch.manual_seed(0)
    out = export_module(RewardModelModule(backbone=chat_llama, tokenizer=chat_llama), tmp_path)
    assert load_tokenizer(out).chat_template == load_tokenizer(chat_llama).chat_template
    card = open(os.path.join(out, "README.md")).read()
    assert ("**TRL-style conversations:** not supported by this export (`apply_chat_template` over a probe "
            "conversation (response 'Simmer it for nine minutes.') does not give the trained ids)") in card
    assert "Score with `reward_input` / `rewards`." in card


@pytest.mark.parametrize("backbone,tok_kind", [("tiny-llama", "words"), ("tiny-gpt2", "words_pad_eos")])
def test_tokenizer_without_chat_template_scores_conversations_too(word_tokenizer_dir, tmp_path, backbone, tok_kind):
    """No chat template (our word-level tokenizers, GPT-2): the export's template writes the plain format
    (`role: content` lines, `assistant:`) with BOS/EOS; with pad = EOS the export's new pad token changes nothing."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    from tests.test_export import _tokenizer

    tokenizer = _tokenizer(tok_kind, word_tokenizer_dir, tmp_path)
    torch.manual_seed(0)
    module = RewardModelModule(backbone=backbone, tokenizer=tokenizer)
    out = export_module(module, tmp_path)
    pairs = fixture_pairs()
    rows, want = project_scores(module, pairs)
    tok = AutoTokenizer.from_pretrained(out)
    ids = [tok.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"] for c in conversations(pairs)]
    assert [list(i) for i in ids] == rows
    rm = AutoModelForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        got = torch.cat([rm(input_ids=torch.tensor([i])).logits[:, 0] for i in ids])
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    classify = pipeline("text-classification", model=out, function_to_apply="none")
    piped = torch.tensor([o["score"] for o in classify([tok.apply_chat_template(c, tokenize=False)
                                                         for c in conversations(pairs)])])
    assert torch.allclose(piped, want, atol=1e-5, rtol=0), (piped - want).abs().max()
    assert tok.apply_chat_template(conversations(pairs)[0][:-1], tokenize=False, add_generation_prompt=True) == \
        render_prompt(load_tokenizer(tokenizer), pairs[0]["prompt"])  # a prompt alone: the plain format, as before


def test_mean_pooled_encoder_never_loads_with_a_random_head(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    torch.manual_seed(0)
    module = RewardModelModule(backbone="minilm", tokenizer="minilm", pooling="mean", keep_layers=1)
    out = export_module(module, tmp_path)
    pairs = fixture_pairs()
    rows, want = project_scores(module, pairs)

    for kwargs in ({}, {"num_labels": 1}):  # the plain load paths raise; none builds a head of its own
        with pytest.raises(ValueError, match="trust_remote_code=True"):
            AutoModelForSequenceClassification.from_pretrained(out, **kwargs)
    rm, info = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True, num_labels=1,
                                                                  output_loading_info=True)
    assert type(rm).__name__ == "PooledRewardModel" and rm.config.pooling == "mean"
    assert not info["missing_keys"] and not info["unexpected_keys"]  # every weight, the trained head included
    assert torch.equal(rm.score.weight, module.head.score.weight)
    with torch.no_grad():
        got = torch.cat([rm.eval()(input_ids=torch.tensor([r])).logits[:, 0] for r in rows])
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()

    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    classify = pipeline("text-classification", model=out, trust_remote_code=True, function_to_apply="none")
    piped = torch.tensor([classify({"text": render_prompt(tok, p["prompt"]), "text_pair": p[k]})["score"]
                          for p in pairs for k in ("chosen", "rejected")])
    assert torch.allclose(piped, want, atol=1e-5, rtol=0), (piped - want).abs().max()
    code = open(os.path.join(out, "modeling_shiftgen_reward.py")).read()
    assert "import lightning" not in code and "datamodules" not in code.split('"""')[-1]  # stands alone
    assert "trust_remote_code=True" in open(os.path.join(out, "README.md")).read()


@pytest.mark.slow
def test_smollm2_reward_model_exports_with_the_project_scores(tmp_path):
    """SmolLM2-135M-Instruct as configs/model/smollm2_student.yaml has it (last-token head), fitted 2 steps on a
    few synthetic pairs, exported, loaded with AutoModelForSequenceClassification and the pipeline."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    from datamodules.pretrained_models import smollm2_dir
    from tests.helpers import quiet_trainer, synth_options, tiny_data, tiny_model

    smollm2_dir()  # converts the packaged GGUF once (~45 s), then reuses it
    start = time.time()
    torch.manual_seed(0)
    module = tiny_model("smollm2", lr=2e-4, backbone="smollm2", pooling="last", dtype="float32", freeze_layers=28)
    dm = tiny_data("smollm2", str(tmp_path / "cache"), batch_size=4, eval_batch_size=4,
                   source_options=synth_options(n_train=16, n_validation=4, n_test=4))
    quiet_trainer(str(tmp_path), max_steps=2, limit_val_batches=0).fit(module, dm)
    out = export_module(module, tmp_path)
    pairs = fixture_pairs() + conversation_probe_pairs()
    rows, want = project_scores(module, pairs)

    tok = AutoTokenizer.from_pretrained(out)
    rm = AutoModelForSequenceClassification.from_pretrained(out).eval()
    ids = [tok.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"] for c in conversations(pairs)]
    assert [list(i) for i in ids] == rows
    with torch.no_grad():
        got = torch.cat([rm(input_ids=torch.tensor([i])).logits[:, 0] for i in ids])
    assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()
    classify = pipeline("text-classification", model=out, function_to_apply="none")
    piped = torch.tensor([o["score"] for o in classify([tok.apply_chat_template(c, tokenize=False)
                                                         for c in conversations(pairs)])])
    assert torch.allclose(piped, want, atol=1e-4, rtol=0), (piped - want).abs().max()
    print(f"SmolLM2 reward model fit + export + checks: {time.time() - start:.0f} s; "
          f"max |Δ| {float((got - want).abs().max()):.2e}")
