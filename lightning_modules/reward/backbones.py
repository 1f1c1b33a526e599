"""Backbone builders: a hub id or local directory, the packaged MiniLM encoder, or a tiny random-init config.

The reward model uses the *base* transformer (`AutoModel`: no LM head, so no vocabulary-sized logits are ever
computed) and reads its final hidden states. GRM (`--model.grm_coef`) also needs the causal LM's head:
`build_backbone_with_lm_head` loads `AutoModelForCausalLM` and splits it into the same base transformer + `lm_head`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig

from datamodules.tokenizers import MINILM, resolve_pretrained

# Tiny configs for tests and the CPU demo (dropout 0: deterministic, and the anchor has no dropout floor).
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
    "tiny-llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
    "tiny-gpt2": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}
QUANTIZATION = ("4bit", "8bit")


@dataclass
class LoraSpec:
    """LoRA adapters through peft.

    Args:
        r: adapter rank.
        alpha: scaling numerator (effective scale alpha / r).
        dropout: dropout on the adapter input.
        target_modules: module names to adapt, or "all-linear".
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: Any = "all-linear"


def is_tiny(name: str) -> bool:
    return name in TINY_CONFIGS


def tiny_config(name: str, vocab_size: int, pad_token_id: int, overrides: Optional[dict] = None) -> PretrainedConfig:
    kwargs = dict(TINY_CONFIGS[name])
    kwargs.update(overrides or {})
    model_type = kwargs.pop("model_type")
    kwargs.update(vocab_size=vocab_size, pad_token_id=pad_token_id, bos_token_id=pad_token_id,
                  eos_token_id=pad_token_id)  # GPT2Config defaults bos/eos to 50256: out of a small vocab
    return AutoConfig.for_model(model_type, **kwargs)


def build_backbone(
    name: str,
    vocab_size: int,
    pad_token_id: int,
    tiny_overrides: Optional[dict] = None,
    quantization: Optional[str] = None,
    dtype: Optional[str] = None,
    attn_implementation: Optional[str] = None,
    keep_layers: Optional[int] = None,
) -> nn.Module:
    """The base transformer for `name` (see module docstring); quantization needs a pretrained checkpoint.

    `keep_layers` loads only the first k transformer layers of a pretrained checkpoint (the embeddings and
    those layers keep their pretrained weights): a smaller model of the same family, e.g. a weak teacher; 0 keeps
    the embeddings alone (a bag-of-embeddings model under mean pooling: no token sees another).
    """
    return _build(AutoModel, name, vocab_size, pad_token_id, tiny_overrides, quantization, dtype, attn_implementation,
                  keep_layers)


# Model types that AutoModelForCausalLM accepts although their attention is bidirectional (an encoder with a
# language-model head bolted on, e.g. BertLMHeadModel): their pretrained weights were never a causal LM.
BIDIRECTIONAL_TYPES = frozenset({
    "bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "electra", "ernie", "megatron-bert",
    "data2vec-text", "rembert", "roc_bert", "xmod", "big_bird", "modernbert",
})
GRM_FLAG = "--model.grm_coef"


def build_backbone_with_lm_head(
    name: str,
    vocab_size: int,
    pad_token_id: int,
    tiny_overrides: Optional[dict] = None,
    quantization: Optional[str] = None,
    dtype: Optional[str] = None,
    attn_implementation: Optional[str] = None,
    keep_layers: Optional[int] = None,
) -> tuple[nn.Module, nn.Module]:
    """(base transformer, LM head) of a causal LM, for GRM: the base is the same class and weights `build_backbone`
    gives (`AutoModelForCausalLM`'s `base_model`), the head its `lm_head` (tied to the input embeddings when the
    config ties them). Refuses, naming `--model.grm_coef`, a backbone without a causal language-model head: the
    MiniLM / BERT-style encoders, a model type AutoModelForCausalLM does not know, and a pretrained checkpoint
    whose untied LM head is missing (a base-model save: the head would be random)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from lightning_modules.reward.grm import split_causal_lm

    if name == MINILM:
        raise ValueError(f"{GRM_FLAG} needs a causal language model's LM head; --model.backbone {name!r} is a "
                         "BERT-style encoder (no language-model head, bidirectional attention): set it to 0")
    cfg = (tiny_config(name, vocab_size, pad_token_id, tiny_overrides) if is_tiny(name)
           else AutoConfig.from_pretrained(resolve_pretrained(name)))
    model_type = getattr(cfg, "model_type", None)
    if model_type in BIDIRECTIONAL_TYPES or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        why = "an encoder (bidirectional attention)" if model_type in BIDIRECTIONAL_TYPES else "not a causal LM"
        raise ValueError(f"{GRM_FLAG} needs a causal language model's LM head; --model.backbone {name!r} "
                         f"(model type {model_type!r}) is {why}: it has no language-model head. Set it to 0")
    causal, info = _build(AutoModelForCausalLM, name, vocab_size, pad_token_id, tiny_overrides, quantization, dtype,
                          attn_implementation, keep_layers, loading_info=True)
    backbone, head = split_causal_lm(causal)
    missing = [k for k in (info or {}).get("missing_keys", []) if "lm_head" in k or "embed_out" in k]
    if missing and head.weight is not backbone.get_input_embeddings().weight:
        raise ValueError(f"{GRM_FLAG}: the checkpoint of --model.backbone {name!r} has no language-model head "
                         f"weights ({missing[:2]}): a base-model save, whose LM head would be random. Use the "
                         "causal LM's checkpoint or set it to 0")
    return backbone, head


def _build(auto_class: Any, name: str, vocab_size: int, pad_token_id: int, tiny_overrides: Optional[dict],
           quantization: Optional[str], dtype: Optional[str], attn_implementation: Optional[str],
           keep_layers: Optional[int], loading_info: bool = False) -> Any:
    """`auto_class` from a tiny config or a checkpoint; with `loading_info`, (model, loading info or None)."""
    if keep_layers is not None and is_tiny(name):
        raise ValueError(f"--model.keep_layers applies to pretrained backbones; for {name!r} set "
                         "--model.tiny_config.num_hidden_layers")
    if is_tiny(name):
        if quantization is not None:
            raise ValueError(f"--model.quantization {quantization} needs a pretrained backbone, not {name!r}")
        cfg = tiny_config(name, vocab_size, pad_token_id, tiny_overrides)
        if attn_implementation:
            cfg._attn_implementation = attn_implementation
        model = auto_class.from_config(cfg)
        return (model, None) if loading_info else model
    if tiny_overrides:
        raise ValueError(f"--model.tiny_config only applies to tiny backbones {sorted(TINY_CONFIGS)}, not {name!r}")
    kwargs: dict[str, Any] = {}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if quantization is not None:
        kwargs["quantization_config"] = bnb_config(quantization)
    path = resolve_pretrained(name)
    if keep_layers is not None:
        kwargs[_layer_count_key(AutoConfig.from_pretrained(path), name, keep_layers)] = keep_layers
    try:
        if loading_info:
            kwargs["output_loading_info"] = True  # (model, {"missing_keys": ...}): a head the checkpoint lacks
        return auto_class.from_pretrained(path, **kwargs)
    except OSError as err:
        hint = "" if os.path.isdir(path) or name == MINILM else (
            " Without network, download the checkpoint elsewhere and pass its local directory as --model.backbone."
        )
        raise OSError(f"could not load backbone {name!r}: {str(err)[:300]}.{hint}") from err


def _layer_count_key(cfg: PretrainedConfig, name: str, keep: int) -> str:
    key = "num_hidden_layers" if hasattr(cfg, "num_hidden_layers") else "n_layer"
    total = getattr(cfg, key)
    if not 0 <= keep <= total:
        raise ValueError(f"--model.keep_layers must be in [0, {total}] for {name!r} ({total} layers), got {keep}")
    return key


def limit_vocabulary(backbone: nn.Module, tokenizer, limit: int) -> None:
    """A small-vocabulary model (a real lexical weakness of older / smaller reward models): every token id >= `limit`
    is read as the tokenizer's unknown token; special tokens are kept. WordPiece and BPE vocabularies are built
    roughly in frequency order, so this keeps about the `limit` most frequent entries. A forward pre-hook on the
    input embedding, so training, weak labels and tests all see the same vocabulary."""
    unk = tokenizer.unk_token_id
    if unk is None:
        raise ValueError(f"--model.vocab_limit needs a tokenizer with an unknown token; "
                         f"{type(tokenizer).__name__} has none")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= len(tokenizer):
        raise ValueError(f"--model.vocab_limit must be an integer in [1, {len(tokenizer)}] (the vocabulary size), "
                         f"got {limit!r}")
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)))

    def to_known(module: nn.Module, args: tuple):
        ids = args[0]
        known = (ids < limit) | torch.isin(ids, special.to(ids.device))
        return (torch.where(known, ids, torch.full_like(ids, unk)), *args[1:])

    backbone.get_input_embeddings().register_forward_pre_hook(to_known)


def bnb_config(quantization: str):
    if quantization not in QUANTIZATION:
        raise ValueError(f"--model.quantization must be one of {QUANTIZATION} or null, got {quantization!r}")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise ImportError("--model.quantization needs bitsandbytes: pip install bitsandbytes") from err
    from transformers import BitsAndBytesConfig

    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)


def apply_lora(backbone: nn.Module, spec: LoraSpec, quantized: bool) -> nn.Module:
    try:
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    except ImportError as err:
        raise ImportError("--model.lora needs peft: pip install peft") from err
    if quantized:
        backbone = prepare_model_for_kbit_training(backbone, use_gradient_checkpointing=False)
    cfg = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=spec.target_modules)
    return get_peft_model(backbone, cfg)


def hidden_size(backbone: nn.Module) -> int:
    cfg = backbone.config
    return int(getattr(cfg, "hidden_size", None) or cfg.n_embd)


def num_layers(backbone: nn.Module) -> int:
    cfg = backbone.config
    n = getattr(cfg, "num_hidden_layers", None)
    return int(n if n is not None else cfg.n_layer)  # 0 is a valid count (keep_layers 0)


def disable_dropout(module: nn.Module) -> None:
    """Dropout off everywhere: reward scores then do not depend on dropout noise (TRL does the same)."""
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
