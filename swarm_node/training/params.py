"""Which parameters training changes: all weights of a full model, only the adapter of a LoRA model.

One definition for the optimizer, the gradient clip, checkpoints and gossip averaging, so they can never
disagree about what "the model's trainable state" is.
"""

from __future__ import annotations

from typing import Any

import torch


def trainable_named(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) pairs with requires_grad, in the model's registration order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    """The trainable parameters alone; with peft this is just the adapter, so frozen weights get no state."""
    return [p for _, p in trainable_named(model)]
