"""Robust fine-tuning baselines that, like ANCHOR, keep the student near its pretrained state
(docs/robust_baselines.md).

- L2-SP (Li et al. 2018): a penalty λ·Σ‖θ − θ₀‖² on the trainable backbone parameters (`l2sp_penalty`).
- LP-FT (Kumar et al. 2022): the head alone for the first k epochs, then the head and the backbone
  (`set_backbone_trainable`).
- WiSE-FT (Wortsman et al. 2022): the fine-tuned backbone interpolated towards θ₀ after loading
  (`interpolate_towards`).

θ₀ is a `PretrainedWeights` snapshot: plain tensors held as an attribute, so never in `state_dict` (checkpoints),
the optimizer, `parameters()` or DDP's buffer broadcast. Plain tensor code; the LightningModule wires it.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn


def check_robust_options(l2sp_coef: float, linear_probe_epochs: int, wise_ft_alpha: Optional[float],
                         lora: object, quantization: Optional[str], classifier: bool) -> None:
    """Refuse, naming the flag, values and combinations these baselines do not define."""
    if not l2sp_coef >= 0:  # also refuses NaN
        raise ValueError(f"--model.l2sp_coef must be >= 0, got {l2sp_coef}")
    if isinstance(linear_probe_epochs, bool) or not isinstance(linear_probe_epochs, int) or linear_probe_epochs < 0:
        raise ValueError(f"--model.linear_probe_epochs must be an integer >= 0, got {linear_probe_epochs!r}")
    if l2sp_coef > 0 and lora is not None:
        # the trainable tensors are the adapters, whose start is a random A and B = 0: ‖A − A₀‖² + ‖B‖² is no
        # distance of the weights from the pretrained ones
        raise ValueError("--model.l2sp_coef with --model.lora would penalise the adapters' drift from their random "
                         "initialisation, not the weights' from the pretrained ones; use one of them")
    if wise_ft_alpha is not None:
        if isinstance(wise_ft_alpha, bool) or not 0.0 <= float(wise_ft_alpha) <= 1.0:
            raise ValueError(f"--model.wise_ft_alpha must be in [0, 1] or null, got {wise_ft_alpha!r}")
        if lora is not None or quantization is not None:
            raise ValueError("--model.wise_ft_alpha interpolates full backbone weights; it does not support "
                             "--model.lora or --model.quantization (adapters and quantized weights are no θ_ft)")
    if classifier and (l2sp_coef > 0 or linear_probe_epochs > 0 or wise_ft_alpha is not None):
        raise ValueError("--model.l2sp_coef / --model.linear_probe_epochs / --model.wise_ft_alpha need our backbone + "
                         "head; an hf_classifier: backbone only evaluates. Drop them.")


class PretrainedWeights:
    """A frozen copy of some backbone parameters, by name (`named_parameters()` names of the backbone).

    Args:
        backbone: the backbone right after it was built (pretrained weights loaded, nothing trained).
        names: which parameters to copy.
    """

    def __init__(self, backbone: nn.Module, names: Iterable[str]):
        wanted = set(names)
        self.tensors = {n: p.detach().clone() for n, p in backbone.named_parameters() if n in wanted}
        if set(self.tensors) != wanted:
            raise ValueError(f"no backbone parameter(s) {sorted(wanted - set(self.tensors))[:4]}")

    def match(self, backbone: nn.Module) -> "PretrainedWeights":
        """Each tensor on its parameter's device and in its dtype (a `bf16-true` fit casts the parameters: θ₀ rounded
        alike keeps the L2-SP distance exactly 0 at the first step)."""
        params = dict(backbone.named_parameters())
        self.tensors = {n: t.to(device=params[n].device, dtype=params[n].dtype) for n, t in self.tensors.items()}
        return self

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


def l2sp_penalty(backbone: nn.Module, theta0: PretrainedWeights, names: Iterable[str]) -> torch.Tensor:
    """Σ_{i ∈ names} ‖θ_i − θ₀_i‖²: a SUM over every element of the named parameters (no 1/2, no mean), in at least
    float32.

    Li et al. write (α/2)‖w − w⁰‖², so their α is 2λ. A 0-dim tensor on the parameters' device, differentiable.
    """
    params = dict(backbone.named_parameters())
    total = None
    for name in names:
        p = params[name]
        dtype = torch.promote_types(p.dtype, torch.float32)
        diff = p.to(dtype) - theta0[name].to(device=p.device, dtype=dtype)
        term = diff.pow(2).sum()
        total = term if total is None else total + term
    if total is None:
        raise ValueError("--model.l2sp_coef: the backbone has no trainable parameter to keep near θ₀")
    return total


def set_backbone_trainable(backbone: nn.Module, names: Iterable[str], trainable: bool) -> None:
    """requires_grad of the named backbone parameters (those `freeze_layers` leaves trainable); the others untouched."""
    wanted = set(names)
    for name, p in backbone.named_parameters():
        if name in wanted:
            p.requires_grad_(trainable)


@torch.no_grad()
def interpolate_towards(backbone: nn.Module, theta0: PretrainedWeights, trainable: Iterable[str],
                        alpha: float) -> list[str]:
    """WiSE-FT in place: θ_i ← (1 − α)·θ₀_i + α·θ_i for the named (fine-tuned) parameters, in at least
    float32, cast back.

    Every other parameter in `theta0` (frozen during fine-tuning: the embeddings and layers `freeze_layers` froze,
    the noise-only biases) must equal the loaded one bit for bit: otherwise the loaded weights did not start from
    θ₀, and no interpolation between them means anything. Returns the interpolated names.
    """
    params = dict(backbone.named_parameters())
    trainable = list(trainable)
    frozen = [n for n in theta0.tensors if n not in set(trainable)]
    differ = [n for n in frozen if not torch.equal(params[n].detach().cpu(), theta0[n].to(params[n].dtype).cpu())]
    if differ:
        raise ValueError(
            f"--model.wise_ft_alpha: the loaded weights differ from this module's pretrained weights θ₀ in parameters "
            f"that fine-tuning keeps frozen ({', '.join(differ[:4])}{', ...' if len(differ) > 4 else ''}), so they "
            "were not fine-tuned from θ₀ (another --model.backbone, or a tiny random backbone built under another "
            "seed: use the student's --seed_everything)")
    for name in trainable:
        p = params[name]
        dtype = torch.promote_types(p.dtype, torch.float32)
        mixed = (1.0 - alpha) * theta0[name].to(device=p.device, dtype=dtype) + alpha * p.to(dtype)
        p.copy_(mixed.to(p.dtype))
    return trainable
