"""Bring your own reward model: any `…ForSequenceClassification` directory or hub id as `--model.backbone
hf_classifier:<path-or-id>` (docs/export.md).

The classifier runs whole, exactly as `transformers` runs it: its own pooling (a decoder's last non-pad token, an
encoder's pooler / [CLS] head) and its own score head, so our pairwise accuracy is the accuracy of the public model
as its authors ship it. It is scored on our pair format (`pair_tokenization.py`: its chat template, BOS/EOS),
padded with its tokenizer's pad token. It evaluates (`cli.py test`, `validate`, the W2S teacher's labels as
`--data.teacher_checkpoint hf_classifier:<dir>`, the protocol's `teacher_pretrained` and `zero_shot` stages);
fine-tuning it with our objectives and ANCHOR is not supported (no separable backbone and head).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

# The name and folder checks live on the data floor (the data module checks a teacher's folder); re-exported here.
from datamodules.classifier_paths import (  # noqa: F401
    PREFIX, canonical_classifier, check_classifier_source, classifier_source, is_hf_classifier, looks_like_path,
)


def classifier_init_args(backbone: str) -> dict[str, str]:
    """`RewardModelModule` arguments of an outside classifier, as `cli.py test --model.backbone hf_classifier:X
    --model.tokenizer X` gives them: the classifier and its own tokenizer (the W2S teacher's labels and the protocol's
    outside teacher / zero-shot stages are built from these, so every path scores the same model the same way)."""
    return {"backbone": backbone, "tokenizer": classifier_source(backbone)}


def check_classifier_options(backbone: str, **options: Any) -> None:
    """Refuse, naming the flag, every option that needs our own backbone + head (not a whole classifier)."""
    unsupported = {
        "anchor_coef": lambda v: v > 0, "lora": lambda v: v is not None, "quantization": lambda v: v is not None,
        "freeze_layers": lambda v: v > 0, "keep_layers": lambda v: v is not None, "tiny_config": bool,
        "vocab_limit": lambda v: v is not None,
        "pooling": lambda v: v != "last", "share_frozen_prefix": bool, "cache_frozen_prefix": bool,
        "gradient_checkpointing": bool, "center_rewards_coef": lambda v: v > 0,
    }
    given = [f"--model.{k} {options[k]!r}" for k, bad in unsupported.items() if k in options and bad(options[k])]
    if given:
        raise ValueError(f"--model.backbone {backbone!r} scores with the classifier's own pooling and head and only "
                         f"evaluates; these options need our backbone + head: {', '.join(given)}. Drop them.")


def load_hf_classifier(backbone: str, tokenizer, dtype: Optional[str] = None,
                       attn_implementation: Optional[str] = None) -> nn.Module:
    """`AutoModelForSequenceClassification.from_pretrained` with one output, padding with `tokenizer`'s pad token."""
    from transformers import AutoModelForSequenceClassification

    source = classifier_source(backbone)
    kwargs: dict[str, Any] = {}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForSequenceClassification.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise OSError(f"--model.backbone {backbone!r}: could not load a sequence classifier: {str(err)[:300]}. "
                      "Without network, pass a local directory (save_pretrained output).") from err
    if model.config.num_labels != 1:
        raise ValueError(f"--model.backbone {backbone!r} has {model.config.num_labels} outputs "
                         f"({model.config.id2label}); a reward model has one (num_labels=1)")
    text_config = model.config.get_text_config()
    if text_config.pad_token_id != tokenizer.pad_token_id:
        # Batches are padded with the tokenizer's pad token; decoder classifiers find the last token by the
        # config's pad id, so the two must agree (a config without one refuses batches of more than one row).
        text_config.pad_token_id = tokenizer.pad_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def classifier_rewards(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The classifier's own score of each row: (N, T) -> (N,)."""
    return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]  # (N,)
