"""A prediction ensemble of reward models, for `test` and `validate` (docs/weight_averaging.md).

K member checkpoints score every pair; the ensemble's margin is

    combine="reward"       Δ = (1/K) Σ_k Δ_k = r̄(a) − r̄(b),  r̄ = (1/K) Σ_k r_k   (the default)
    combine="probability"  Δ = logit((1/K) Σ_k σ(Δ_k))

and everything else is `RewardModelModule`'s evaluation (the same `val/acc`, `test/acc/<split>`, transfer scores and
`test_results.json`), so the protocol reads an ensemble's results as a single model's. Members are frozen (eval mode,
no gradients) and each keeps its own scoring options, `cache_frozen_prefix` included: the prefix store is keyed by the
prefix's weights, so members that share a start share one store and the prefix runs once per sequence for all K.

    python cli.py test --config <the student's configs> \\
        --model.class_path lightning_modules.reward.ensemble.RewardEnsembleModule \\
        --model.init_args.members '[a.ckpt, b.ckpt]'

(`--model.class_path` after the student's configs: the init arguments the ensemble does not take are dropped, and
`--model.tokenizer` stays linked to `--data.tokenizer`; no `--ckpt_path`: the members carry the weights.)
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

from lightning_modules.reward.reward_model import RewardModelModule
from lightning_modules.reward.weak_labeller import load_teacher

Combine = Literal["reward", "probability"]
FLAG = "--model.init_args.members"


def combine_margins(margins: torch.Tensor, combine: Combine = "reward") -> torch.Tensor:
    """The ensemble's margins (B,) from the members' (K, B), in at least float32.

    "probability": logit(p̄) with p̄ = mean_k σ(Δ_k) and 1 − p̄ = mean_k σ(−Δ_k), i.e.
    logsumexp_k log σ(Δ_k) − logsumexp_k log σ(−Δ_k) (the 1/K cancels): finite for any finite margins.
    """
    margins = margins.to(torch.promote_types(margins.dtype, torch.float32))  # (K, B)
    if combine == "reward":
        return margins.mean(0)
    if combine == "probability":
        return torch.logsumexp(F.logsigmoid(margins), 0) - torch.logsumexp(F.logsigmoid(-margins), 0)
    raise ValueError(f"--model.combine must be 'reward' or 'probability', got {combine!r}")


class RewardEnsembleModule(RewardModelModule):
    """The mean of several reward models (see the module docstring); evaluation only.

    Why the mean of rewards by default: the ensemble is then again a reward model, r̄(x, y) = (1/K) Σ_k r_k(x, y),
    usable wherever one is (a per-response score for best-of-n or RL, a teacher's margins), and its pair margin is
    the mean of the members' margins (each member's arbitrary reward offset cancels). The price: a member with
    larger rewards weighs more. "probability" averages the members' preference probabilities σ(Δ_k) instead: each
    member's vote is bounded, so one overconfident member cannot dominate, but it defines pair preferences only (no
    per-response reward: `forward` refuses). Both agree in sign whenever all members do.

    Args:
        members: the members' checkpoints (`RewardModelModule` .ckpt, or `hf_classifier:<dir or hub id>`), at least
            one; any reward models of one tokenizer (a path given twice counts twice and is loaded once).
        combine: "reward" (mean of rewards, i.e. of margins) or "probability" (logit of the mean of σ(Δ_k)).
        tokenizer: the data's tokenizer (the CLI links it to `--data.tokenizer`); it must be the members'. Null
            takes theirs.
        ceiling_results: a ceiling run's `test_results.json`: adds PGR to the transfer scores of `test`.
    """

    def __init__(self, members: list[str], combine: Combine = "reward", tokenizer: Optional[str] = None,
                 ceiling_results: Optional[str] = None):
        # LightningModule's constructor, not RewardModelModule's: no backbone of its own, the members are the weights;
        # what the inherited evaluation reads is set below (tests check it against a RewardModelModule's metrics)
        LightningModule.__init__(self)
        self.save_hyperparameters()
        if isinstance(members, str) or not members:
            raise ValueError(f"{FLAG} must be a non-empty list of reward-model checkpoints, got {members!r}")
        if combine not in ("reward", "probability"):
            raise ValueError(f"--model.init_args.combine must be 'reward' or 'probability', got {combine!r}")
        self.combine = combine
        self.member_paths = [str(p) for p in members]
        unique = list(dict.fromkeys(self.member_paths))
        models = [load_teacher(path, FLAG) for path in unique]  # checked: intact, a reward model's, finite
        for model in models:
            model.eval()
            model.requires_grad_(False)
        self.tokenizer_name = check_same_tokenizer(unique, models, tokenizer)
        self.members = nn.ModuleList(models)
        self.member_index = [unique.index(p) for p in self.member_paths]  # (K,) into `members`
        self._init_evaluation()  # RewardModelModule's evaluation state
        self.frozen_reference = None
        self.frozen_prefix = None  # the members have their own
        self.wise_ft_alpha, self.wise_ft_applied = None, False

    @property
    def reference_coef(self) -> float:
        return 0.0  # no frozen reference model (callbacks/reference_model.py): nothing trains

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_hidden_states: bool = False):
        """The mean reward r̄ (N,) of the members (combine "reward" only), and None."""
        if output_hidden_states:
            raise ValueError("RewardEnsembleModule has no hidden states of its own (each member has its own)")
        if self.combine != "reward":
            raise ValueError("--model.init_args.combine probability defines pair margins, not per-response rewards")
        rewards = torch.stack([m(input_ids, attention_mask)[0] for m in self.members])  # (U, N)
        return combine_margins(rewards[self.member_index], "reward"), None  # (N,)

    def pair_margins(self, batch: dict) -> torch.Tensor:
        margins = [m.pair_margins(batch) for m in self.members]  # U × (B,)
        return combine_margins(torch.stack([margins[i] for i in self.member_index]), self.combine)  # (B,)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            raise ValueError("RewardEnsembleModule is for test / validate: its members are finished checkpoints. "
                             "Fit a RewardModelModule; to make one model of several that share a start, see "
                             "lightning_modules.reward.weight_averaging")
        super().setup(stage)

    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._invalidate_member_prefixes()

    def on_test_start(self) -> None:
        super().on_test_start()
        self._invalidate_member_prefixes()

    def _invalidate_member_prefixes(self) -> None:
        for model in self.members:
            if model.frozen_prefix is not None:
                model.frozen_prefix.invalidate()  # fingerprinted again at first use: weights may have been changed

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        raise ValueError(f"RewardEnsembleModule takes its weights from {FLAG}; drop --ckpt_path")


def check_same_tokenizer(paths: list[str], models: list[RewardModelModule], tokenizer: Optional[str]) -> str:
    """The members' tokenizer name (or `tokenizer` when given): refuses members, or a `tokenizer`, that tokenize
    differently (vocabulary, rules, chat template, padding side), naming them."""
    from datamodules.tokenizers import load_tokenizer

    names = [m.tokenizer_name for m in models]
    identities: dict[str, str] = {}

    def identity(name: str) -> str:
        if name not in identities:
            identities[name] = tokenizer_identity(load_tokenizer(name))
        return identities[name]

    for path, name in zip(paths[1:], names[1:]):
        if name != names[0] and identity(name) != identity(names[0]):
            raise ValueError(f"{FLAG}: {paths[0]!r} uses tokenizer {names[0]!r} and {path!r} uses {name!r}, which "
                             "tokenize differently; an ensemble scores one tokenization of the data, so its members "
                             "must share a tokenizer")
    if tokenizer is not None and tokenizer != names[0] and identity(tokenizer) != identity(names[0]):
        raise ValueError(f"--model.init_args.tokenizer {tokenizer!r} (the data's, linked to --data.tokenizer) differs "
                         f"from the members' {names[0]!r}; drop it or give theirs")
    return tokenizer or names[0]


def tokenizer_identity(tok) -> str:
    """What decides how text becomes ids here: the fast tokenizer's full definition (or the vocabulary), the chat
    template, the padding side and the pad token."""
    backend = getattr(tok, "backend_tokenizer", None)
    rules = backend.to_str() if backend is not None else repr(sorted(tok.get_vocab().items()))
    return repr((rules, getattr(tok, "chat_template", None), tok.padding_side, tok.pad_token))
