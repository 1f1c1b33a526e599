"""Local stand-ins for hub checkpoints: a random-initialised causal LM of a real architecture family, saved with
`save_pretrained` beside a locally built word-level tokenizer, so that the code under test loads it exactly as it
loads a hub download (`AutoModelForCausalLM` / `AutoModel.from_pretrained(<dir>)`, `AutoTokenizer`).

Used by `benchmarks/gpu_check.py` (realistic widths, a few layers) and `tests/test_mixture_base_models.py` (tiny
widths). Nothing here downloads anything; nothing queries CUDA.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

# Per family: the model_type and the widths of the 1B-class checkpoint it stands in for ("realistic": hidden, MLP,
# heads, KV heads, head dim as published; only the depth is cut), and a tiny variant for CPU tests.
FAMILIES: dict[str, dict] = {
    "qwen2": dict(  # Qwen/Qwen2.5-1.5B
        hub_id="Qwen/Qwen2.5-1.5B",
        realistic=dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_attention_heads=12,
                       num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
        tiny=dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True),
        pad_is_eos=True,  # Qwen2.5's tokenizer pads with its EOS token (<|endoftext|>)
    ),
    "llama": dict(  # meta-llama/Llama-3.2-1B
        hub_id="meta-llama/Llama-3.2-1B",
        realistic=dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True,
                       rope_theta=500000.0),
        tiny=dict(model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True),
        pad_is_eos=False,
    ),
    "gemma3_text": dict(  # google/gemma-3-1b-pt
        hub_id="google/gemma-3-1b-pt",
        realistic=dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_attention_heads=4,
                       num_key_value_heads=1, head_dim=256, max_position_embeddings=4096, sliding_window=512,
                       query_pre_attn_scalar=256),
        tiny=dict(model_type="gemma3_text", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=512, sliding_window=32,
                  query_pre_attn_scalar=16),
        pad_is_eos=False,
    ),
    "gpt2": dict(  # openai-community/gpt2 (124M)
        hub_id="openai-community/gpt2",
        realistic=dict(model_type="gpt2", n_embd=768, n_head=12, n_positions=1024),
        tiny=dict(model_type="gpt2", n_embd=64, n_head=4, n_positions=512),
        pad_is_eos=False,
    ),
}
# Plain words (in the vocabulary) instead of <|im_start|>-style markers: a word-level tokenizer cannot split those.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant :{% endif %}")
TEMPLATE_WORDS = ("user", "assistant", "system", ":")


def family_config(family: str, vocab_size: int, special_ids: dict, layers: int = 2, scale: str = "tiny"):
    """The `transformers` config of `family` at `scale` ("tiny" or "realistic") with `layers` layers."""
    from transformers import AutoConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    if scale not in ("tiny", "realistic"):
        raise ValueError(f"scale must be 'tiny' or 'realistic', got {scale!r}")
    kwargs = dict(FAMILIES[family][scale])
    model_type = kwargs.pop("model_type")
    depth = "n_layer" if model_type == "gpt2" else "num_hidden_layers"
    kwargs[depth] = layers
    if model_type == "gpt2":
        kwargs.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if model_type == "gemma3_text":
        # one sliding and one global layer at 2 layers (the checkpoint alternates 5 sliding : 1 global)
        kwargs["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    kwargs.update(vocab_size=vocab_size, **special_ids)
    return AutoConfig.for_model(model_type, **kwargs)


def build_tokenizer_dir(words: Iterable[str], out_dir: str, pad_is_eos: bool = False) -> str:
    """A word-level tokenizer over `words` + the chat template's words, with the chat template, saved to out_dir."""
    from datamodules.tokenizers import build_wordlevel_tokenizer

    tok = build_wordlevel_tokenizer(list(words) + list(TEMPLATE_WORDS), chat_template=CHAT_TEMPLATE)
    if pad_is_eos:
        tok.pad_token = tok.eos_token
    tok.save_pretrained(out_dir)
    return out_dir


def build_model_dir(family: str, out_dir: str, words: Iterable[str], layers: int = 2, scale: str = "tiny",
                    seed: int = 0, dtype: Optional[str] = None) -> str:
    """A random-initialised `family` causal LM + its tokenizer in one directory (like a hub repository).

    Args:
        family: a key of FAMILIES ("qwen2", "llama", "gemma3_text", "gpt2").
        out_dir: the directory to write (config.json, model.safetensors, tokenizer files).
        words: the tokenizer's vocabulary (special tokens and the chat template's words are added).
        layers: transformer layers.
        scale: "tiny" (hidden 64) or "realistic" (the widths of the 1B-class checkpoint).
        seed: torch seed of the random initialisation.
        dtype: saved weight dtype (None = float32; "bfloat16" halves the files of the realistic widths).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir  # built before (same arguments are the caller's business: one directory per setting)
    tmp = out_dir + ".partial"
    build_tokenizer_dir(words, tmp, pad_is_eos=FAMILIES[family]["pad_is_eos"])
    tok = AutoTokenizer.from_pretrained(tmp)
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg = family_config(family, len(tok), ids, layers, scale)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(tmp)
    os.replace(tmp, out_dir)  # complete or absent: a killed build never leaves a directory that loads half
    return out_dir
