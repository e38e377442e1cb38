"""Optimizer construction from TrainingConfig, over trainable parameters only (full model or LoRA)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw", "sgd")


def build_optimizer(
    params: Iterable[nn.Parameter], name: str, lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """Adam (L2 weight decay, the paper's choice), AdamW (decoupled decay) or plain SGD."""
    params = list(params)
    if not params:
        raise ValueError("the model has no trainable parameters")
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
