"""Builders for the policy's causal LM: a hub id / local directory, or a tiny random GPT-2 built from a config."""
from __future__ import annotations

import hashlib
import json

import torch
from torch import nn

TINY = "tiny-gpt2"


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of the vocabulary (token -> id): a checkpoint trained with another tokenizer has another fingerprint."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha1(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def build_causal_lm(
    backbone: str,
    tokenizer,
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 4,
    max_positions: int = 512,
    dropout: float = 0.0,
) -> nn.Module:
    """`backbone="tiny-gpt2"`: a random-init GPT-2 sized by the other arguments over `tokenizer`'s vocabulary;
    anything else: `AutoModelForCausalLM.from_pretrained(backbone)` (hub id or local directory)."""
    if backbone == TINY:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=len(tokenizer), n_positions=max_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
        return GPT2LMHeadModel(cfg)
    from transformers import AutoModelForCausalLM

    from datamodules.tokenizers import resolve_pretrained

    path = resolve_pretrained(backbone)  # "smollm2": the packaged model's converted directory (its own errors)

    try:
        # fp32 weights whatever the checkpoint's dtype (hub checkpoints are often bf16): the policy is fully
        # fine-tuned, and bf16-mixed keeps fp32 master weights only if they start in fp32
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise OSError(
            f"--model.backbone {backbone!r} could not be loaded: {str(err)[:300]}\n"
            f"Without network, pass a local directory, or '{TINY}' for a tiny random model."
        ) from err
    n_emb = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > n_emb:
        raise ValueError(
            f"--data.tokenizer has {len(tokenizer)} tokens but --model.backbone {backbone!r} embeds only {n_emb}: "
            "use the backbone's own tokenizer"
        )
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    # from_pretrained returns eval mode and Lightning trains in whatever mode it finds: a base with dropout (GPT-2's
    # 0.1) would fine-tune without it. The samplers switch to eval themselves and back.
    return model.train()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on the first real token (left padding safe)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
