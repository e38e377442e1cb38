"""A model's trainable parameters as a list of float32 tensors: read, write, fingerprint, compare.

Gossip averages these lists; the fingerprint decides who can average with whom, and the digest/probe let
tests and metrics tell whether two nodes hold the same parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from swarm_node.training.params import trainable_named


def arch_fingerprint(model: Any) -> str:
    """Hash of the names and shapes of the trainable parameters (16 hex chars).

    Two nodes can average only if this matches; with LoRA it covers the adapter names, rank and targets.
    """
    desc = ";".join(f"{n}:{tuple(p.shape)}" for n, p in trainable_named(model))
    return hashlib.sha256(desc.encode()).hexdigest()[:16]


def get_params(model: Any) -> list[torch.Tensor]:
    """Detached float32 CPU copies of the trainable parameters (bf16 is cast: hivemind refuses it)."""
    return [p.detach().to("cpu", torch.float32).clone() for _, p in trainable_named(model)]


@torch.no_grad()
def set_params(model: Any, tensors: Sequence[torch.Tensor]) -> None:
    params = trainable_named(model)
    if len(params) != len(tensors):
        raise ValueError(f"expected {len(params)} tensors, got {len(tensors)}")
    for (_, p), t in zip(params, tensors, strict=True):
        p.copy_(t.to(p.device, p.dtype))


def params_digest(tensors: Sequence[torch.Tensor]) -> str:
    """sha256 (16 hex) of the float32 bytes: equal digests mean bit-identical parameters."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def params_probe(tensors: Sequence[torch.Tensor], k: int = 4) -> list[float]:
    """k fixed random projections (seed 0): nodes whose probes agree hold nearly the same parameters.

    Unlike a digest this tolerates compression error, so it compares nodes after an all-reduce.
    """
    g = torch.Generator().manual_seed(0)
    out = torch.zeros(k, dtype=torch.float64)
    for t in tensors:
        flat = t.detach().to("cpu", torch.float64).reshape(-1)
        out += torch.randn(k, flat.numel(), generator=g, dtype=torch.float64) @ flat
    return [float(v) for v in out]


def params_sq_distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return float(sum(((x - y) ** 2).sum() for x, y in zip(a, b, strict=True)))


