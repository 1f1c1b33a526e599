"""Regularisers of the reward model's training loss, as plug-ins (`--model.regularisers`; base.py has the interface,
shorthands.py the `--model.anchor_coef`-style flags that build the five shipped ones)."""
from lightning_modules.reward.regularisers.anchor import Anchor
from lightning_modules.reward.regularisers.base import Regulariser, StepOutputs, build_regulariser
from lightning_modules.reward.regularisers.bsr import BSR
from lightning_modules.reward.regularisers.centering import RewardCentering
from lightning_modules.reward.regularisers.grm import GRM
from lightning_modules.reward.regularisers.l2sp import L2SP

__all__ = ["Anchor", "BSR", "GRM", "L2SP", "Regulariser", "RewardCentering", "StepOutputs", "build_regulariser"]
