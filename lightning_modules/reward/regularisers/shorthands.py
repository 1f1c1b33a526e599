"""The shipped regularisers' shorthand flags: `--model.anchor_coef 10` is `--model.regularisers` holding
`Anchor(coef=10)` (docs/robust_baselines.md, "Regularisers as plug-ins").

The shorthands were the module's own options before the regularisers became plug-ins; sweeps (`sweep:
{--model.anchor_coef: [...]}`), configs and checkpoints use them. A shorthand with a nonzero coefficient adds its
plug-in to the list, in the order below (the order the terms were added in before: the same loss, bit for bit), in
front of the plug-ins `--model.regularisers` lists. A coefficient of 0 adds nothing, as before.
"""
from __future__ import annotations

from typing import Any, Mapping

from lightning_modules.reward.regularisers.anchor import Anchor
from lightning_modules.reward.regularisers.base import Regulariser, build_regulariser
from lightning_modules.reward.regularisers.bsr import BSR
from lightning_modules.reward.regularisers.centering import RewardCentering
from lightning_modules.reward.regularisers.grm import GRM
from lightning_modules.reward.regularisers.l2sp import L2SP

# plug-in -> {its init arg: the module option that is its shorthand}; the first key is the coefficient
SHORTHANDS: list[tuple[type[Regulariser], dict[str, str]]] = [
    (GRM, {"coef": "grm_coef", "form": "grm_form", "beta": "grm_beta", "logp_reduction": "grm_logp_reduction"}),
    (RewardCentering, {"coef": "center_rewards_coef"}),
    (BSR, {"coef": "bsr_coef"}),
    (Anchor, {"coef": "anchor_coef", "layers": "anchor_layers"}),
    (L2SP, {"coef": "l2sp_coef"}),
]
_RANKS = {cls: rank for rank, (cls, _) in enumerate(SHORTHANDS)}


def from_shorthands(options: Mapping[str, Any]) -> list[Regulariser]:
    """The plug-ins the shorthand options turn on (coefficient > 0), in the shorthands' order."""
    return [cls(**{arg: options[name] for arg, name in names.items()})
            for cls, names in SHORTHANDS if options[names["coef"]] > 0]


def combine(options: Mapping[str, Any], listed: list[Regulariser]) -> list[Regulariser]:
    """The shorthands' plug-ins, then the listed ones; a coefficient of 0 leaves a plug-in out. One kind given both
    ways is refused (which coefficient would be meant?)."""
    ours = from_shorthands(options)
    for cls, names in SHORTHANDS:
        if any(type(r) is cls for r in ours) and any(type(r) is cls for r in listed):
            raise ValueError(f"--model.{names['coef']} and --model.regularisers both give {cls.__name__}: give it once")
    return [r for r in ours + listed if r.coef != 0]


def as_shorthands(init_args: dict) -> dict:
    """A resolved config's model init args with a `regularisers` list of shipped plug-ins written back as the
    shorthand options that give the same run, and an empty list dropped: the keys every finished run's stage
    identity was computed from before the plug-ins (`protocols.engine.stage_identity` applies it). A list the
    shorthands cannot spell (another plug-in, a kind twice, another order, a kind also given by its shorthand) stays
    as it is: no older run was that run."""
    listed = [r for r in init_args.get("regularisers") or []
              if not (isinstance(r, dict) and (r.get("init_args") or {}).get("coef") == 0)]
    out = {k: v for k, v in init_args.items() if k != "regularisers"}
    if not listed:
        return out
    on = [rank for rank, (_, names) in enumerate(SHORTHANDS) if (out.get(names["coef"]) or 0) > 0]
    ranks = [_RANKS.get(_class_of(r)) for r in listed]
    if None in ranks or ranks != sorted(set(ranks)) or (on and min(ranks) <= max(on)) or set(on) & set(ranks):
        return init_args
    for rank, entry in zip(ranks, listed):
        _, names = SHORTHANDS[rank]
        args = entry.get("init_args") or {}
        if set(args) - set(names) or any(name not in out for name in names.values()):
            return init_args
        out.update({names[arg]: value for arg, value in args.items()})
    return out


def _class_of(entry: Any) -> Any:
    """The class a resolved list entry names (`lightning_modules.reward.regularisers.Anchor` and
    `...regularisers.anchor.Anchor` are one class), or None."""
    try:
        return type(build_regulariser({**entry, "init_args": {}})) if isinstance(entry, dict) else None
    except (ValueError, TypeError):
        return None
