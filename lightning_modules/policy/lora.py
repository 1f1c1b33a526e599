"""LoRA for the policies (`--model.lora`): adapters on the causal LM, and how a later stage starts from them.

The spec and the peft wrapping are Part A's (`lightning_modules.reward.backbones.LoraSpec` / `apply_lora`); what is
particular to the policies is the chain of stages. A checkpoint of a LoRA run holds the whole peft model (frozen
base + adapters), so it resumes and tests as it is. A stage that *starts* from it (`--model.init_checkpoint`: RL
from SFT, temporal stage 2 from stage 1, an export) loads it into the same peft model and merges the adapters into
the base weights (`merge_and_unload`): the plain LM it then holds is the trained model, and a fresh adapter put on
it (LoRA B starts at zero) leaves it unchanged. With adapters disabled that merged base is the start checkpoint's
model, which is what GRPO's KL is taken to (`callbacks.reference_model`, mode `disable_adapter`: no copy).
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from lightning_modules.reward.backbones import LoraSpec, apply_lora

FLAG = "--model.lora"


def as_lora_spec(value: Any) -> Optional[LoraSpec]:
    """None, a `LoraSpec`, or its fields as a mapping (a checkpoint written from Python, a test) -> a checked spec."""
    if value is None:
        return None
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(LoraSpec.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{FLAG} has no field {unknown[0]!r}; its fields: r, alpha, dropout, target_modules")
        value = LoraSpec(**value)
    if not isinstance(value, LoraSpec):
        raise ValueError(f"{FLAG} must be a mapping {{r, alpha, dropout, target_modules}} or null, got {value!r}")
    check_lora_spec(value)
    return value


def check_lora_spec(spec: LoraSpec) -> None:
    if isinstance(spec.r, bool) or not isinstance(spec.r, int) or spec.r < 1:
        raise ValueError(f"{FLAG}.r must be an integer >= 1, got {spec.r!r}")
    if not spec.alpha > 0:
        raise ValueError(f"{FLAG}.alpha must be > 0, got {spec.alpha!r}")
    if not 0 <= spec.dropout < 1:
        raise ValueError(f"{FLAG}.dropout must be in [0, 1), got {spec.dropout!r}")
    targets = spec.target_modules
    names = [targets] if isinstance(targets, str) else targets
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{FLAG}.target_modules must be 'all-linear' or a non-empty list of module names, "
                         f"got {targets!r}")


def add_adapters(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """`model` wrapped in a peft model with fresh adapters (only they train); peft's refusals name the flag."""
    try:
        return apply_lora(model, spec, quantized=False)
    except ValueError as err:  # "Target modules {...} not found", "Target module Dropout() is not supported", ...
        first = str(err).strip().splitlines()[0][:300]
        raise ValueError(f"{FLAG}.target_modules {spec.target_modules!r} cannot be adapted on "
                         f"{type(model).__name__}: {first}") from err


def has_adapters(state: dict) -> bool:
    """Whether an LM state dict (keys without the module's "model." prefix) holds LoRA adapters."""
    return any(".lora_A." in k for k in state)


def load_trained_lm(model: nn.Module, state: dict, spec: Optional[LoraSpec], source: str) -> nn.Module:
    """The LM a stage starts from: `state` loaded into `model`, its adapters (if any) merged into the base weights.

    Args:
        model: the freshly built plain LM.
        state: the checkpoint's LM state (keys without the "model." prefix).
        spec: the checkpoint's `lora` hyperparameter (None: trained without LoRA).
        source: names the checkpoint in errors (flag and path).
    """
    if has_adapters(state) != (spec is not None):
        raise ValueError(f"{source}: its weights {'hold' if has_adapters(state) else 'hold no'} LoRA adapters but "
                         f"its hyperparameters say lora={spec!r}: not a checkpoint written by these modules")
    if spec is None:
        model.load_state_dict(state)
        return model
    wrapped = add_adapters(model, spec)
    wrapped.load_state_dict(state)
    # peft froze the base; the merged model trains whole unless this stage puts adapters of its own on it
    return wrapped.merge_and_unload().requires_grad_(True)


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
