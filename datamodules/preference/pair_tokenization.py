"""Render and tokenize preference pairs: prompt (chat template, or a plain format) + each response.

Sequence layout:  [prefix] prompt-tokens [separator] response-tokens [suffix]
- prompt text: `tokenizer.apply_chat_template(messages, add_generation_prompt=True)` when the tokenizer has a
  chat template; otherwise the plain format "role: content" per message, one per line, then "assistant:".
- prefix/separator/suffix: for BERT-style encoders [CLS] / [SEP] / [SEP]; for decoders BOS (when the tokenizer
  has one and the template does not already add it) / nothing / EOS.
- the response starts at `response_start`: every token from there on (suffix included) is a response token
  (what ANCHOR's mask covers).
Truncation (`max_length`), both responses share one prompt:
- "keep_response" (default): drop prompt tokens from the left (the oldest context) until the longer response
  fits; if a response alone does not fit, cut its end and count it.
- "truncate_response": keep the prompt whole, cut the responses' ends.
- "drop": drop pairs that do not fit (counted).
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

from transformers import PreTrainedTokenizerBase

TRUNCATION_POLICIES = ("keep_response", "truncate_response", "drop")
MIN_PROMPT_TOKENS = 8  # keep_response never cuts the prompt below this many tokens


def is_encoder_tokenizer(tok: PreTrainedTokenizerBase) -> bool:
    return tok.cls_token_id is not None and tok.sep_token_id is not None


def render_prompt(tok: PreTrainedTokenizerBase, messages: list[dict]) -> str:
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    return text if is_encoder_tokenizer(tok) else text + "\nassistant:"


class PairTokenizer:
    """Tokenizes records into `a_input_ids`/`b_input_ids` (a = chosen) with their response starts.

    Args:
        tokenizer: the backbone's tokenizer.
        max_length: maximum tokens per sequence.
        truncation: one of TRUNCATION_POLICIES.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int, truncation: str = "keep_response"):
        if truncation not in TRUNCATION_POLICIES:
            raise ValueError(f"--data.truncation must be one of {TRUNCATION_POLICIES}, got {truncation!r}")
        if max_length < 2 * MIN_PROMPT_TOKENS:
            raise ValueError(f"--data.max_length must be at least {2 * MIN_PROMPT_TOKENS}, got {max_length}")
        self.tok, self.max_length, self.truncation = tokenizer, max_length, truncation
        encoder = is_encoder_tokenizer(tokenizer)
        self.prefix = [tokenizer.cls_token_id] if encoder else (
            [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else [])
        self.separator = [tokenizer.sep_token_id] if encoder else []
        self.suffix = [tokenizer.sep_token_id] if encoder else (
            [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])

    def __call__(self, batch: dict, counts: Optional[Counter] = None) -> dict:
        """A `datasets.map(batched=True)` function: columns prompt/chosen/rejected -> token columns."""
        prompts = [render_prompt(self.tok, p) for p in batch["prompt"]]
        enc = lambda texts: self.tok(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
        p_ids, a_ids, b_ids = enc(prompts), enc(batch["chosen"]), enc(batch["rejected"])
        out = {k: [] for k in ("a_input_ids", "a_response_start", "b_input_ids", "b_response_start", "status")}
        for p, a, b, text in zip(p_ids, a_ids, b_ids, prompts):
            if self.prefix and text.startswith(self.tok.decode(self.prefix)):
                p = p[len(self.prefix):]  # the chat template already wrote BOS as text
            status, p, a, b = self.fit(p, a, b)
            head = self.prefix + p + self.separator
            out["a_input_ids"].append(head + a + self.suffix)
            out["b_input_ids"].append(head + b + self.suffix)
            out["a_response_start"].append(len(head))
            out["b_response_start"].append(len(head))
            out["status"].append(status)
        return out

    def fit(self, prompt: list, a: list, b: list) -> tuple[str, list, list, list]:
        fixed = len(self.prefix) + len(self.separator) + len(self.suffix)
        longest = max(len(a), len(b))
        if fixed + len(prompt) + longest <= self.max_length:
            return "ok", prompt, a, b
        if self.truncation == "drop":
            return "dropped_too_long", prompt, a, b
        if self.truncation == "keep_response":
            keep = max(self.max_length - fixed - longest, min(MIN_PROMPT_TOKENS, len(prompt)))
            prompt = prompt[len(prompt) - keep:] if keep > 0 else []
            room = self.max_length - fixed - len(prompt)
            status = "truncated_prompt" if longest <= room else "truncated_response"
            return status, prompt, a[:room], b[:room]
        room = self.max_length - fixed - len(prompt)
        if room < 1:
            prompt = prompt[len(prompt) - (self.max_length - fixed - 1):]
            room = 1
        return "truncated_response", prompt, a[:room], b[:room]
