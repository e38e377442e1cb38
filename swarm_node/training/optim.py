"""Optimizer construction from TrainingConfig, over trainable parameters only (full model or LoRA)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw", "sgd")


def build_optimizer(
    params: Iterable[nn.Parameter], name: str, lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """Adam (L2 weight decay, the paper's choice), AdamW (decoupled decay) or plain SGD.

    Adam and AdamW run fused (one kernel over all parameters) where torch has it for the parameters' device
    and dtype: the default for-each kernel allocates temporaries the size of the whole optimizer state.
    """
    params = list(params)
    if not params:
        raise ValueError("the model has no trainable parameters")
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return cls(params, lr=lr, weight_decay=weight_decay, fused=_fused_ok(params))
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")


def _fused_ok(params: list[nn.Parameter]) -> bool:
    """Fused Adam needs every parameter on one device type that supports it, in a floating dtype."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = {p.device.type for p in params}
    return (len(devices) == 1 and devices <= set(_get_fused_kernels_supported_devices())
            and all(p.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64) for p in params))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
