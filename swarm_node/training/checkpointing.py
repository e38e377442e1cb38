"""Activation checkpointing of a model's layers that works in eval mode and beside a KV cache.

transformers checkpoints its decoder layers only in train mode, and drops the KV cache while it does. The
trainer recomputes log-probs in eval mode (dropout would bias the importance ratios), and its shared-prompt
path runs completions on top of a prompt's cache. So the trainer checkpoints the layers itself: each layer's
forward runs under `torch.utils.checkpoint` (non-reentrant), which keeps only the layer's inputs and runs the
layer again in the backward pass. A layer that writes a KV cache must not be recomputed (the rerun would
write it twice): the trainer runs such forwards inside `paused()`, and reads a cache only through a frozen
view whose update does not write (`frozen_cache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class LayerCheckpointing:
    """Checkpoint these modules' forwards while gradients are on; counts forwards and recomputations."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        if not layers:
            raise ValueError("gradient checkpointing needs the model's layers; none were found")
        self.layers = list(layers)
        self.forwards = 0  # checkpointed layer forwards
        self.recomputed = 0  # layer forwards run again in a backward pass
        self._paused = 0
        self._originals = [layer.forward for layer in self.layers]
        for layer, forward in zip(self.layers, self._originals, strict=True):
            layer.forward = self._wrap(forward)  # an instance attribute: names and state_dict are unchanged

    def _wrap(self, forward: Any) -> Any:
        def checkpointed(*args: Any, **kwargs: Any) -> Any:
            if self._paused or not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            self.forwards += 1
            first = [True]

            def run(*a: Any, **k: Any) -> Any:
                if not first[0]:
                    self.recomputed += 1
                first[0] = False
                return forward(*a, **k)

            return checkpoint(run, *args, use_reentrant=False, **kwargs)

        return checkpointed

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run layers plainly inside (forwards that write a KV cache)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def remove(self) -> None:
        for layer in self.layers:
            layer.__dict__.pop("forward", None)


def frozen_cache(cache: Any) -> bool:
    """Make a transformers DynamicCache read-only: each layer's update returns the cached keys and values
    with the new ones appended, without storing them. A checkpointed layer that reads the cache then gets
    the same tensors when it is run again in the backward pass. False (cache unchanged) for a cache
    without per-layer keys and values (transformers < 4.54), where the caller must not checkpoint."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(isinstance(getattr(layer, "keys", None), torch.Tensor)
                             and not getattr(layer, "is_sliding", False) for layer in layers):
        return False
    for layer in layers:
        keys, values = layer.keys, layer.values

        def update(key_states: torch.Tensor, value_states: torch.Tensor, *_: Any, _k: torch.Tensor = keys,
                   _v: torch.Tensor = values, **__: Any) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.cat([_k, key_states], dim=-2), torch.cat([_v, value_states], dim=-2)

        layer.update = update
    return True
