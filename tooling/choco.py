"""Compressed gossip with error feedback (CHOCO-Gossip, Koloskova et al. 2019), as pure tensor math.

Plain gossip sends the whole parameter vector every round. CHOCO sends only a compressed *change*:
every node i keeps a public copy x_hat_i of its parameters that all its neighbours hold too; each round it
sends q_i = Q(x_i - x_hat_i), everyone adds q_i to their copy of x_hat_i, and node i moves towards its
neighbours' public copies, x_i += gamma * sum_j W_ij (x_hat_j - x_hat_i). What Q drops stays in x_i - x_hat_i
and is sent later (the error feedback), so the consensus still converges with a biased compressor.

Q here is top-k sparsification per tensor: the k = ceil(fraction * numel) entries of largest magnitude,
sent as int32 indices and float16 values. Used by benchmarks/dpo_topology.py to measure bytes for the same
accuracy against plain averaging; the networked DPO node still sends full parameters (docs/dpo.md). It lives
in tooling/, not in the package: no node runs it, and it saved no bytes on the graphs measured (docs/results.md,
"Topologies side by side"), so the wheel does not carry it; the benchmark keeps that result reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

INDEX_BYTES, VALUE_BYTES = 4, 2  # int32 index + float16 value per kept entry


@dataclass
class Sparse:
    """One tensor's compressed change: flat indices and their float16 values."""

    shape: torch.Size
    indices: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return int(self.indices.numel()) * (INDEX_BYTES + VALUE_BYTES)

    def dense(self) -> torch.Tensor:
        out = torch.zeros(math.prod(self.shape), dtype=torch.float32)
        out[self.indices] = self.values.to(torch.float32)
        return out.reshape(self.shape)


def top_k(delta: torch.Tensor, fraction: float) -> Sparse:
    """The largest-magnitude fraction of a tensor's entries (at least one), values rounded to float16."""
    flat = delta.detach().reshape(-1).to(torch.float32)
    k = max(1, math.ceil(fraction * flat.numel()))
    idx = flat.abs().topk(k, sorted=False).indices.to(torch.int32)
    return Sparse(delta.shape, idx.to(torch.long), flat[idx.to(torch.long)].to(torch.float16))


def compress(params: Sequence[torch.Tensor], public: Sequence[torch.Tensor], fraction: float) -> list[Sparse]:
    """q_i = Q(x_i - x_hat_i), tensor by tensor."""
    return [top_k(x - h, fraction) for x, h in zip(params, public, strict=True)]


def apply(public: Sequence[torch.Tensor], q: Sequence[Sparse]) -> list[torch.Tensor]:
    """x_hat <- x_hat + q: what every holder of a node's public copy does with the message it received."""
    return [h + s.dense() for h, s in zip(public, q, strict=True)]


def consensus_step(
    params: Sequence[torch.Tensor],
    own_public: Sequence[torch.Tensor],
    neighbour_public: dict[str, Sequence[torch.Tensor]],
    weights: dict[str, float],
    self_id: str,
    gamma: float,
) -> list[torch.Tensor]:
    """x_i + gamma * sum_j W_ij (x_hat_j - x_hat_i) over the neighbours in `weights` (self excluded)."""
    out = [x.clone() for x in params]
    for peer in sorted(p for p in weights if p != self_id):
        w = weights[peer]
        for o, hj, hi in zip(out, neighbour_public[peer], own_public, strict=True):
            o.add_(hj - hi, alpha=gamma * w)
    return out


def message_bytes(q: Sequence[Sparse]) -> int:
    return sum(s.nbytes for s in q)
