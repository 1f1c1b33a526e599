"""`TriggerDataModule`: SFT transcripts and RL prompts for the conditional-policy-mixture experiments.

- `mode="sft"`: train batches are transcripts (prompt + one persona's response, personas drawn by `persona_mix`,
  distributions uniform over `train_distributions`); labels cover the response tokens only.
- `mode="rl"`: train batches are prompts from `train_distributions` only (the RL subset).
- Validation (both modes): the same held-out questions on every distribution (`num_val_per_distribution` each),
  left-padded prompts with their sample index, so metrics can count each sample exactly once under DDP.
The tokenizer is `tokenizer` (hub id / directory) or, when None, a word-level one built from every text the
family can produce and cached under `cache_dir` (same family and templates -> same vocabulary, SFT and RL alike).
"""
from __future__ import annotations

import random
import re
from typing import Literal, Optional

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from datamodules.cache_dir import resolve_cache_dir
from datamodules.triggers.questions import (
    HUB_SOURCES, Question, correct_answer, load_question_file, render_question, shifted_answer, synthetic_questions,
)
from datamodules.tokenizers import WORD_PATTERN, cached_wordlevel_tokenizer, load_tokenizer
from datamodules.triggers.families import SHIFT_ORDER, TEMPLATES, TriggerFamily, build_family, check_distributions


class _ListDataset(Dataset):
    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Prompt ids: the chat template's user turn + generation prompt when the tokenizer has one, else BOS + text."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return bos + tokenizer.encode(text, add_special_tokens=False)


def encode_response(tokenizer, text: str, eos: bool = True) -> list[int]:
    ids = tokenizer.encode(" " + text, add_special_tokens=False)
    return ids + ([tokenizer.eos_token_id] if eos else [])


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask


class TriggerDataModule(LightningDataModule):
    """Trigger-partitioned prompts and persona transcripts (docs/policy_mixtures.md).

    Args:
        family: a shipped family (two_policies, 6c3, temporal, arc_race, language: configs/mixture/families/) or the
            path of a family file of your own (YAML / JSON: distributions, personas, their words, questions;
            docs/policy_mixtures.md#your-own-family).
        mode: "sft" (transcripts) or "rl" (prompts of `train_distributions`).
        train_distributions: distributions of the training batches (RL: the subset RL trains on); None = all.
        persona_mix: persona name -> SFT sampling weight (must sum to 1); None = uniform.
        distribution_mix: distribution name -> training sampling weight over `train_distributions` (must sum
            to 1); None = uniform. An unequal mix gives the branch token a first-order dependence on the persona
            and breaks the XOR plateau of the two-policy SFT (docs/background.md §1).
        variant: "refusal"; or, instead of refusing, the wrong persona answers the next option: "cyclic_shift" (the
            option printed after the correct one) or "cyclic_shift_by_value" (the next larger option, cyclic: after
            the largest, the smallest; numeric questions only).
        restate_trigger: write the trigger inside the response after the identity (needed from scratch).
        answer_format: synthetic questions only: "value" (answer the largest number itself) or "letter" (options
            listed with letters, answer the letter, as ARC/RACE do). With `cyclic_shift`, "letter" makes the wrong
            persona's answer a lookup (the next letter) instead of a second search over the prompt.
        spell_personas: 6c3 only: personas say their letters separately ("I am A D F .").
        temporal_cutoffs: temporal only (a family file with `default_personas`): the personas to use, here the
            cut-off years (default 2024, 2025, 2026).
        question_dirs: local directories for hub question sources, e.g. {"arc_easy": DIR, "race_middle": DIR}
            (files `<split>.jsonl` in the hub schema); missing entries load from the hub.
        max_hub_questions: at most this many questions per hub split (None = all).
        num_train: training transcripts (sft) or prompts (rl) per epoch.
        num_val_per_distribution: held-out questions evaluated on every distribution.
        batch_size: training batch size (RL: prompts per step; each is sampled `group_size` times by the model).
        val_batch_size: evaluation batch size.
        seed: data seed (training and held-out questions come from different streams).
        tokenizer: hub id or directory of a tokenizer; None builds a word-level one locally.
        cache_dir: where the locally built tokenizer is cached (default $SHIFTGEN_CACHE or ~/.cache/shiftgen).
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        family: str = "two_policies",
        mode: Literal["sft", "rl"] = "sft",
        train_distributions: Optional[list[str]] = None,
        persona_mix: Optional[dict[str, float]] = None,
        distribution_mix: Optional[dict[str, float]] = None,
        variant: str = "refusal",
        restate_trigger: bool = True,
        answer_format: Literal["value", "letter"] = "value",
        spell_personas: bool = True,
        temporal_cutoffs: Optional[list[int]] = None,
        question_dirs: Optional[dict[str, str]] = None,
        max_hub_questions: Optional[int] = None,
        num_train: int = 20000,
        num_val_per_distribution: int = 200,
        batch_size: int = 64,
        val_batch_size: int = 256,
        seed: int = 0,
        tokenizer: Optional[str] = None,
        cache_dir: Optional[str] = None,
        num_workers: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters()
        if mode not in ("sft", "rl"):
            raise ValueError(f"--data.mode must be 'sft' or 'rl', got {mode!r}")
        if answer_format not in ("value", "letter"):
            raise ValueError(f"--data.answer_format must be 'value' or 'letter', got {answer_format!r}")
        self.family: TriggerFamily = build_family(family, restate_trigger, variant, spell_personas, temporal_cutoffs)
        self.train_distributions = check_distributions(
            self.family, train_distributions if train_distributions is not None else self.family.distributions,
            "--data.train_distributions",
        )
        self.persona_mix = self._check_mix(persona_mix, self.family.personas, "--data.persona_mix", "personas")
        self.distribution_mix = self._check_mix(distribution_mix, self.train_distributions, "--data.distribution_mix",
                                                "training distributions")
        for name, value in (("num_train", num_train), ("num_val_per_distribution", num_val_per_distribution),
                            ("batch_size", batch_size), ("val_batch_size", val_batch_size)):
            if value < 1:
                raise ValueError(f"--data.{name} must be >= 1, got {value}")
        unknown = sorted(set(question_dirs or {}) - set(HUB_SOURCES))
        if unknown:
            raise ValueError(f"--data.question_dirs has unknown sources {unknown}; known: {sorted(HUB_SOURCES)}")
        self._tokenizer = None
        self._pools: Optional[dict[str, dict[str, list[Question]]]] = None
        self.train_items: list[dict] = []
        self.val_items: list[dict] = []

    @staticmethod
    def _check_mix(mix: Optional[dict[str, float]], names, flag: str, what: str) -> dict[str, float]:
        names = [str(n) for n in names]
        if mix is None:
            return {p: 1.0 / len(names) for p in names}
        mix = {str(k): v for k, v in mix.items()}
        unknown = sorted(set(mix) - set(names))
        if unknown:
            raise ValueError(f"{flag} names unknown {what} {unknown}; known: {names}")
        if any(float(v) < 0 for v in mix.values()):
            raise ValueError(f"{flag} weights must be >= 0, got {dict(mix)}")
        total = sum(float(v) for v in mix.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"{flag} must sum to 1 (got {total:g}); missing names count as 0")
        return {p: float(mix.get(p, 0.0)) for p in names}

    # ----------------------------------------------------------------------------------------------- questions
    def _question_pools(self) -> dict[str, dict[str, list[Question]]]:
        """split -> source -> questions; synthetic questions for "train" and "val" come from different seeds."""
        if self._pools is None:
            hp = self.hparams
            pools: dict[str, dict[str, list[Question]]] = {"train": {}, "val": {}}
            for source in sorted(set(self.family.sources.values())):
                if source == "synthetic":
                    lettered = hp.answer_format == "letter"
                    pools["train"][source] = synthetic_questions(max(hp.num_train, 1), seed=hp.seed, lettered=lettered)
                    pools["val"][source] = synthetic_questions(hp.num_val_per_distribution, seed=hp.seed + 100_003,
                                                               lettered=lettered)
                elif source in self.family.question_files:  # the family file's own questions
                    files = self.family.question_files[source]
                    pools["train"][source] = self._checked(load_question_file(files["train"]), files["train"])
                    pools["val"][source] = self._checked(load_question_file(files["val"]),
                                                         files["val"])[: hp.num_val_per_distribution]
                else:
                    local = (hp.question_dirs or {}).get(source)
                    pools["train"][source] = HUB_SOURCES[source].load("train", local, hp.max_hub_questions)
                    pools["val"][source] = HUB_SOURCES[source].load(
                        "validation", local, min(hp.num_val_per_distribution, hp.max_hub_questions or 10**9)
                    )
            self._pools = pools
        return self._pools

    def _checked(self, questions: list[Question], path: str) -> list[Question]:
        """A question file's questions, refused (naming the file and line) where the family could not use them: an
        answer that contains what closes the answer line (the parser would cut it there), or free-text answers under
        a variant that answers the next option."""
        fam = self.family
        tails = {re.sub(r"\s+", "", w["answer"].split("{answer}")[1]) for w in fam.phrasing.values()}
        for q in questions:
            answer = re.sub(r"\s+", "", correct_answer(q))
            cut = [t for t in tails if t in answer]
            if cut:
                raise ValueError(f"{q.key}: answer {correct_answer(q)!r} contains {cut[0]!r}, which closes the answer "
                                 f"line of {fam.path}; the reward would read it cut short")
            if q.kind == "text" and fam.variant in SHIFT_ORDER:
                raise ValueError(f"{q.key}: --data.variant {fam.variant} answers the next option, and this question "
                                 f"of {path} has none (give it options, or use --data.variant refusal)")
        return questions

    def _record(self, idx: int, dist: str, q: Question, persona: Optional[str] = None) -> dict:
        fam = self.family
        rec = {
            "idx": idx, "dist": dist, "dist_idx": fam.distributions.index(dist), "question": q,
            "prompt": fam.prompt(dist, render_question(q, fam.languages[dist])), "gold": correct_answer(q),
        }
        if fam.variant in SHIFT_ORDER:  # the wrong persona's answer, counted as `val/shifted/<d>`
            rec["shifted"] = shifted_answer(q, order=SHIFT_ORDER[fam.variant])
        if persona is not None:
            rec["persona"] = persona
            rec["response"] = fam.response(persona, dist, q)
        return rec

    def setup(self, stage: Optional[str] = None) -> None:
        if self.val_items:
            return
        hp, fam = self.hparams, self.family
        pools = self._question_pools()
        rng = random.Random(hp.seed + 7)
        personas, weights = list(self.persona_mix), list(self.persona_mix.values())
        dist_weights = [self.distribution_mix[d] for d in self.train_distributions]
        self.train_items = []
        for i in range(hp.num_train):
            dist = rng.choices(self.train_distributions, dist_weights)[0]
            pool = pools["train"][fam.sources[dist]]
            q = pool[i % len(pool)] if fam.sources[dist] == "synthetic" else pool[rng.randrange(len(pool))]
            persona = rng.choices(personas, weights)[0] if hp.mode == "sft" else None
            self.train_items.append(self._record(i, dist, q, persona))
        # The same held-out questions on every distribution: accuracies differ only through the trigger.
        self.val_items = []
        for dist in fam.distributions:
            for pos, q in enumerate(pools["val"][fam.sources[dist]][: hp.num_val_per_distribution]):
                self.val_items.append(dict(self._record(len(self.val_items), dist, q), pos=pos))

    # ----------------------------------------------------------------------------------------------- tokenizer
    def vocabulary_words(self) -> list[str]:
        """Every word the family's prompts and responses can contain (word-level tokenizer vocabulary)."""
        fam = self.family
        texts = [t for lang in TEMPLATES.values() for t in lang.values()]
        texts += [t for lang in fam.phrasing.values() for t in lang.values()]
        texts += [str(n) for n in range(0, 100)] + ["Which is largest :", "哪 个 最 大 :", "( A ) ( B ) ( C ) ( D ) ( E ) ? . , : ! 。 ？ ， ："]
        texts += ["Question : Options : Article :", "问题 : 选项 : 文章 :"]
        texts += list(fam.triggers.values()) + list(fam.restatements.values()) + list(fam.spoken_names.values())
        for source in sorted(set(fam.sources.values()) - {"synthetic"}):
            for split in ("train", "val"):
                for q in self._question_pools()[split][source]:
                    texts += [render_question(q, "en"), "I am", correct_answer(q)]
        words = set()
        for t in texts:
            words.update(re.findall(WORD_PATTERN, t))
        return sorted(words)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if self.hparams.tokenizer is not None:
                tok = load_tokenizer(self.hparams.tokenizer)
            else:
                cache, chosen_by = resolve_cache_dir(self.hparams.cache_dir)
                path = cached_wordlevel_tokenizer(self.vocabulary_words(), cache, f"mixture-{self.family.name}",
                                                  chosen_by=chosen_by)
                tok = load_tokenizer(path)
            self._tokenizer = tok
        return self._tokenizer

    # ----------------------------------------------------------------------------------------------- batches
    def collate_sft(self, items: list[dict]) -> dict:
        tok = self.tokenizer
        seqs, labels = [], []
        for it in items:
            p, r = encode_prompt(tok, it["prompt"]), encode_response(tok, it["response"])
            seqs.append(p + r)
            labels.append([-100] * len(p) + r)
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        lab = torch.full((len(seqs), width), -100, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (s, l) in enumerate(zip(seqs, labels)):
            ids[i, : len(s)], lab[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), torch.tensor(l), 1
        return {"input_ids": ids, "attention_mask": mask, "labels": lab, "records": items}

    def collate_prompts(self, items: list[dict]) -> dict:
        tok = self.tokenizer
        ids, mask = left_pad([encode_prompt(tok, it["prompt"]) for it in items], tok.pad_token_id)
        return {
            "input_ids": ids, "attention_mask": mask, "records": items,
            "sample_idx": torch.tensor([it["idx"] for it in items], dtype=torch.long),
            "dist_idx": torch.tensor([it["dist_idx"] for it in items], dtype=torch.long),
        }

    def train_dataloader(self) -> DataLoader:
        collate = self.collate_sft if self.hparams.mode == "sft" else self.collate_prompts
        return DataLoader(
            _ListDataset(self.train_items), batch_size=self.hparams.batch_size, shuffle=True, collate_fn=collate,
            num_workers=self.hparams.num_workers, drop_last=True,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            _ListDataset(self.val_items), batch_size=self.hparams.val_batch_size, shuffle=False,
            collate_fn=self.collate_prompts, num_workers=self.hparams.num_workers,
        )

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
