"""A policy whose tokenizer has a chat template (SmolLM2's case) exports and reproduces our greedy completions.

The training code renders every prompt as the chat template's user turn + generation prompt (`encode_prompt`). The
export's self-check used to feed the reloaded model the raw prompt text (`tokenizer(prompt)`), so every chat policy
was refused: "greedy completions differ from ours on 4 of 4 held-out prompts" (issue 47). Here a tiny random Llama
with a byte-level BPE tokenizer and a ChatML template (a default system prompt, like SmolLM2's) stands in for
SmolLM2: it is SFT-ed one step, exported through `cli.py export`, and loaded with plain `AutoModelForCausalLM` and
`pipeline("text-generation")`. The slow test does the same with the real SmolLM2-135M-Instruct.
"""
import os
import re
import time

import pytest
import torch

from cli import main

# SmolLM2's template, shortened: a default system turn when the chat has none; ChatML turns; the generation prompt.
CHATML = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nYou are a "
          "helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_llama(tmp_path_factory) -> str:
    """A SmolLM2-shaped base directory: ChatML tokenizer (pad <|endoftext|> = 0, bos <|im_start|>, eos <|im_end|>),
    BPE merges learned from the two_policies texts (short sequences), a tiny random Llama with tied embeddings."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from datamodules.triggers.datamodule import TriggerDataModule

    root = tmp_path_factory.mktemp("chat_llama")
    dm = TriggerDataModule(family="two_policies", num_train=200, num_val_per_distribution=4,
                           cache_dir=str(root / "cache"))
    dm.setup("fit")
    texts = [it["prompt"] for it in dm.train_items] + [it["response"] for it in dm.train_items]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(texts + ["You are a helpful assistant.", "system user assistant"], trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                  bos_token="<|im_start|>", eos_token="<|im_end|>")
    tok.chat_template = CHATML
    out = str(root / "base")
    tok.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def plain_transformers_greedy(directory: str, prompts: list[str]) -> tuple[list[list[int]], list[str]]:
    """A user's greedy completions: AutoModelForCausalLM + the chat template, and the card's pipeline call."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = []
    for p in prompts:
        enc = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_dict=True, return_tensors="pt")
        with torch.no_grad():
            seq = model.generate(**enc)[0, enc["input_ids"].shape[1]:].tolist()
        ids.append(seq[: seq.index(tok.eos_token_id) + 1] if tok.eos_token_id in seq else seq)
    generate = pipeline("text-generation", model=directory)
    texts = [generate([{"role": "user", "content": p}], return_full_text=False)[0]["generated_text"] for p in prompts]
    return ids, texts


def our_greedy(module, dm, prompts: list[str]) -> list[list[int]]:
    """The evaluation's own sampler, greedy, one prompt at a time."""
    from datamodules.triggers.datamodule import encode_prompt, left_pad

    tok, out = dm.tokenizer, []
    module.eval()
    for p in prompts:
        ids, mask = left_pad([encode_prompt(tok, p)], tok.pad_token_id)
        comp, cmask = module.sample(ids, mask, temperature=0.0)
        out.append(comp[0][cmask[0].bool()].tolist())
    return out


def sft_and_export(base: str, root, max_steps: int, perturb: bool, **data) -> tuple:
    """SFT `base` for `max_steps` on two_policies, save the checkpoint, export it with `cli.py export`."""
    import lightning as L

    from datamodules.triggers.datamodule import TriggerDataModule
    from lightning_modules.policy.sft import PolicySFTModule

    torch.manual_seed(0)
    dm = TriggerDataModule(family="two_policies", tokenizer=base, cache_dir=str(root / "cache"), **data)
    module = PolicySFTModule(backbone=base, tokenizer=base, max_new_tokens=12, lr=1e-4, eval_generate=False,
                             stop_fidelity=None)
    trainer = L.Trainer(max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0)
    trainer.fit(module, dm)
    if perturb:  # a tiny model trained for seconds says one thing to every prompt: large random weights make
        with torch.no_grad():  # completions depend on the prompt, so equality checks something
            for p in module.model.parameters():
                p.add_(torch.randn_like(p))
    ckpt = str(root / "sft.ckpt")
    trainer.save_checkpoint(ckpt)
    main(["export", "--ckpt_path", ckpt, "--out_dir", str(root / "policy")])
    return module, dm


def test_chat_template_policy_exports_with_our_greedy_completions(chat_llama, tmp_path):
    module, dm = sft_and_export(chat_llama, tmp_path, max_steps=1, perturb=True, num_train=32, batch_size=16,
                                num_val_per_distribution=3)
    prompts = [it["prompt"] for it in dm.val_items]
    ours = our_greedy(module, dm, prompts)
    ids, texts = plain_transformers_greedy(str(tmp_path / "policy"), prompts)
    assert ids == ours
    assert texts == [dm.tokenizer.decode(c, skip_special_tokens=True) for c in ours]
    assert len({tuple(c) for c in ours}) > 1 and all(ours)  # real, prompt-dependent completions
    card = open(tmp_path / "policy" / "README.md").read()
    assert '[{"role": "user", "content": ' in card and "pass it as a message list" in card
    # the card's call is the one checked above, on the first held-out prompt
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert "'Distribution : A ." in code


def test_policy_export_refuses_a_tokenizer_that_renders_prompts_differently(chat_llama, tmp_path, monkeypatch,
                                                                           capsys):
    """The check compares the pipeline's prompt ids with training's before generating: a mismatch names it."""
    import lightning_modules.export.policy as policy

    monkeypatch.setattr(policy, "pipeline_prompt_ids", lambda tok, p: tok(p)["input_ids"])  # the old, raw-text path
    with pytest.raises(SystemExit) as info:
        sft_and_export(chat_llama, tmp_path, max_steps=1, perturb=False, num_train=16, batch_size=16,
                       num_val_per_distribution=2)
    assert info.value.code == 2
    assert ("refused: the tokenizer cannot give `pipeline(\"text-generation\")` the training prompts' ids (the chat "
            "template's user turn + generation prompt)") in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "policy")


@pytest.mark.slow
def test_smollm2_policy_sft_exports_and_generates_like_ours(tmp_path):
    """SmolLM2-135M-Instruct SFT-ed on two_policies (the CPU config's learning rate and batch, a few steps), exported,
    and loaded with plain AutoModelForCausalLM: the same greedy completions as the evaluation's sampler on every
    held-out prompt. Measured: about 2 min on 2 busy cores (conversion of the packaged GGUF not included)."""
    from datamodules.pretrained_models import smollm2_dir

    smollm2_dir()  # converts the packaged GGUF once (~45 s), then reuses it
    start = time.time()
    module, dm = sft_and_export("smollm2", tmp_path, max_steps=4, perturb=False, num_train=32, batch_size=8,
                                num_val_per_distribution=3)
    prompts = [it["prompt"] for it in dm.val_items]
    ours = our_greedy(module, dm, prompts)
    ids, texts = plain_transformers_greedy(str(tmp_path / "policy"), prompts)
    assert ids == ours
    assert texts == [dm.tokenizer.decode(c, skip_special_tokens=True) for c in ours]
    assert all(ours)
    print(f"SmolLM2 policy SFT + export + check: {time.time() - start:.0f} s; completions: {texts}")
