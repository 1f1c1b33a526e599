"""A scalar reward model that pools a transformers backbone its own way: `AutoModelForSequenceClassification`
with `trust_remote_code=True` (docs/export.md).

`cli.py export` copies this file, unchanged, into the export of a reward model that no transformers class pools like
(an encoder such as MiniLM/BERT, or mean pooling): `BertForSequenceClassification` scores the pooler's [CLS] vector,
this model the mean of the last hidden states over the non-padding tokens (or the last one) through a linear head
without bias, as it was trained. Its `model_type` is not a transformers one, so
`AutoModelForSequenceClassification.from_pretrained(dir)` without `trust_remote_code=True` raises instead of
loading a randomly initialised head. It imports only torch and transformers.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

POOLINGS = ("mean", "last")


class PooledRewardConfig(PretrainedConfig):
    """The backbone's own config (a dict with its `model_type`) and the pooling.

    Args:
        backbone_config: `backbone.config.to_dict()` of the trained backbone.
        pooling: "mean" (over tokens with attention mask 1) or "last" (the last such token, either padding side).
    """

    model_type = "shiftgen_pooled_reward"

    def __init__(self, backbone_config: dict | None = None, pooling: str = "mean", **kwargs):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.backbone_config = dict(backbone_config or {})
        self.pooling = pooling
        kwargs.setdefault("num_labels", 1)
        super().__init__(**kwargs)


class PooledRewardModel(PreTrainedModel):
    """backbone -> pooled hidden state (N, H) -> `score` (N, 1): one reward per sequence."""

    config_class = PooledRewardConfig
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = False

    def __init__(self, config: PooledRewardConfig):
        super().__init__(config)
        sub = dict(config.backbone_config)
        self.backbone = AutoModel.from_config(AutoConfig.for_model(sub.pop("model_type"), **sub))
        self.score = nn.Linear(self.backbone.config.hidden_size, 1, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs) -> SequenceClassifierOutput:
        # token_type_ids are not passed on: the model was trained with one segment ([CLS] prompt [SEP] response
        # [SEP] all type 0), while a tokenizer called on a text pair marks the response as type 1.
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (N, T, H)
        if self.config.pooling == "mean":
            m = attention_mask.unsqueeze(-1).to(h.dtype)  # (N, T, 1)
            pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)  # (N, H)
        else:  # the last token with mask 1, left or right padding
            last = (attention_mask * torch.arange(attention_mask.shape[1], device=h.device)).argmax(1)  # (N,)
            pooled = h[torch.arange(len(h), device=h.device), last]  # (N, H)
        return SequenceClassifierOutput(logits=self.score(pooled.to(self.score.weight.dtype)))  # (N, 1)
