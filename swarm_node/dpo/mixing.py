"""Gossip and federated averaging math: x_i <- sum_j W_ij x_j over the payloads that arrived.

The same functions serve the in-process simulation (tests, benchmarks) and the networked node, so what
the tests measure is what runs. Neighbours that sent nothing, a bad payload, or (with a `RobustAverager`,
dpo/robust.py) parameters it refuses are missing, and our row of the Metropolis-Hastings matrix is
rebuilt on the live subgraph; with it, the accepted neighbours are clipped before they are averaged.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from swarm_node.dpo.robust import RobustAverager, distance
from swarm_node.dpo.topology import mixing_matrix_from_adjacency
from swarm_node.dpo.vectors import params_sq_distance
from swarm_node.swarm.averaging.payload import PayloadError, decode_params

if TYPE_CHECKING:
    from swarm_node.swarm.averaging.allreduce import AllReduce

log = logging.getLogger(__name__)


@dataclass
class RejectCounter:
    """Counts (and logs) dropped payloads by reason, for metrics."""

    counts: Counter = field(default_factory=Counter)

    def drop(self, peer: str, err: PayloadError) -> None:
        self.counts[err.reason] += 1
        log.warning("dropped parameters from %s: %s", peer, err)


def live_mixing_row(
    adjacency: np.ndarray, ids: Sequence[str], self_id: str, missing: Iterable[str] = ()
) -> dict[str, float]:
    """Our row of the Metropolis-Hastings matrix of the live subgraph (the graph minus `missing` peers).

    When every node removes the same vertices (a peer that is gone for everyone: each of its neighbours
    misses it, and the others see its stale membership record), the rows form the MH matrix of the live
    subgraph: still symmetric and doubly stochastic, so the average is preserved. Until a node's view
    catches up, its row belongs to a nearby matrix; the next membership refresh rebuilds the graph.
    """
    idx = {p: i for i, p in enumerate(ids)}
    me = idx[self_id]
    live = np.asarray(adjacency, dtype=bool).copy()
    for p in set(missing) - {self_id}:
        if p in idx:
            live[idx[p], :] = live[:, idx[p]] = False
    w = mixing_matrix_from_adjacency(live)
    return {ids[j]: float(w[me, j]) for j in range(len(ids)) if w[me, j] > 0.0}


def combine(weights: dict[str, float], params: dict[str, Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """x <- sum_j w_j x_j, summed in sorted peer-id order so equal inputs give bit-identical results."""
    order = sorted(weights)
    total = sum(weights[p] for p in order)
    out = [torch.zeros_like(t) for t in params[order[0]]]
    for p in order:
        w = weights[p] / total
        for o, t in zip(out, params[p], strict=True):
            o.add_(t, alpha=w)
    return out


def consensus_distance(own: Sequence[torch.Tensor], others: Sequence[Sequence[torch.Tensor]]) -> float:
    """||x_i - mean_j x_j|| over the neighbours received (0.0 when none arrived), in float64 (huge finite
    float32 values would overflow)."""
    if not others:
        return 0.0
    sq = 0.0
    for k, t in enumerate(own):
        mean = torch.stack([o[k].double() for o in others]).mean(dim=0)
        sq += float(((t.double() - mean) ** 2).sum())
    return sq ** 0.5


@dataclass
class GossipResult:
    params: list[torch.Tensor]
    weights: dict[str, float]
    present: list[str]
    missing: list[str]
    consensus_distance: float
    clipped: list[str] = field(default_factory=list)  # robust averaging: neighbours pulled in to the radius
    clip_radius: float | None = None  # robust averaging: this round's radius (None: nothing could be clipped)
    pull_ratio: float | None = None  # robust gossip: how far the average moved us / sum_j W_ij ||x_j - x_i||


def pull_ratio(own: Sequence[torch.Tensor], averaged: Sequence[torch.Tensor], weights: dict[str, float],
               distances: dict[str, float]) -> float | None:
    """||x_new - x_i|| / sum_j W_ij ||x_j - x_i|| over the neighbours averaged with (after clipping).

    1 when every neighbour pulls the same way (or there is one), about 0.7 between honest neighbours on
    the 8-node ring and exponential graph of benchmarks/dpo_byzantine.py, and 0 when the pulls cancel:
    what a dissensus attacker makes of a ring node (it sends the point that cancels the node's pull
    towards its honest neighbour). None when nothing moved us (no neighbour, or all at distance 0).
    """
    total = sum(weights.get(p, 0.0) * d for p, d in distances.items())
    return distance(averaged, own) / total if total > 0.0 else None


def _decode_received(
    peers: Sequence[str],
    received: dict[str, bytes | None],
    shapes: Sequence[torch.Size | tuple[int, ...]],
    arch_fp: str,
    compression: str,
    rejects: RejectCounter | None,
    max_bytes: int | None,
) -> dict[str, list[torch.Tensor]]:
    """Decode the payloads that arrived from `peers`; a bad one is dropped with a counted reason."""
    out: dict[str, list[torch.Tensor]] = {}
    for peer in peers:
        blob = received.get(peer)
        if blob is None:
            continue
        try:
            out[peer] = decode_params(blob, shapes, arch_fp, compression, max_bytes)
        except PayloadError as err:
            if rejects is not None:
                rejects.drop(peer, err)
    return out

def gossip_step(
    self_id: str,
    own_payload: bytes,
    received: dict[str, bytes | None],
    ids: Sequence[str],
    adjacency: np.ndarray,
    shapes: Sequence[torch.Size | tuple[int, ...]],
    arch_fp: str,
    compression: str = "float16",
    rejects: RejectCounter | None = None,
    max_bytes: int | None = None,
    known_missing: Iterable[str] = (),
    robust: RobustAverager | None = None,
) -> GossipResult:
    """One gossip average for node `self_id`, from the bytes it published and the bytes it received.

    Our own contribution is decoded from the same bytes we sent, so every node averages identical numbers
    (federated mode ends bit-identical). Neighbours that sent nothing, or a payload that fails validation,
    count as missing and the row is re-weighted on the live subgraph (minus `known_missing` too: peers
    the membership shows gone, so that rows of nodes that are not its neighbours agree). With `robust`,
    replays and outliers are refused too, and the rest are clipped (ClippedGossip, dpo/robust.py).
    """
    rejects = rejects if rejects is not None else RejectCounter()
    own = decode_params(own_payload, shapes, arch_fp, compression)
    idx = {p: i for i, p in enumerate(ids)}
    nbrs = [ids[j] for j in np.flatnonzero(np.asarray(adjacency)[idx[self_id]])]
    if robust is not None:
        received = robust.screen(own_payload, {p: received.get(p) for p in nbrs}, rejects)
    decoded = _decode_received(nbrs, received, shapes, arch_fp, compression, rejects, max_bytes)
    clip = robust.gossip(own, decoded, rejects) if robust is not None else None
    mixed = clip.params if clip is not None else decoded
    present = [p for p in nbrs if p in mixed]
    missing = [p for p in nbrs if p not in mixed]
    weights = live_mixing_row(adjacency, ids, self_id, set(missing) | set(known_missing))
    dist = consensus_distance(own, [decoded[p] for p in present])
    res = GossipResult(combine(weights, {self_id: own, **mixed}), weights, present, missing, dist)
    if clip is not None:
        res.clipped, res.clip_radius = clip.clipped, clip.radius
        res.pull_ratio = pull_ratio(own, res.params, weights, clip.distances)
        robust.averaged(res.params)
    return res


def federated_step(
    self_id: str,
    own_payload: bytes,
    received: dict[str, bytes | None],
    participants: Sequence[str],
    shapes: Sequence[torch.Size | tuple[int, ...]],
    arch_fp: str,
    compression: str = "float16",
    rejects: RejectCounter | None = None,
    max_bytes: int | None = None,
    robust: RobustAverager | None = None,
) -> GossipResult:
    """Exact (uniform) average of the participants' published parameters, self included if sampled.

    Every node decodes the same bytes and sums them in the same order, so all nodes that received every
    participant end the round with bit-identical parameters. A node outside the sample adopts the
    average; if no participant arrived it keeps its own parameters. With `robust`, replays and outliers are
    refused and the rest clipped around the participants' coordinate-wise median (dpo/robust.py), the
    same computation on every node.
    """
    rejects = rejects if rejects is not None else RejectCounter()
    own = decode_params(own_payload, shapes, arch_fp, compression)
    others = [p for p in participants if p != self_id]
    if robust is not None:
        received = robust.screen(own_payload, {p: received.get(p) for p in others}, rejects)
    decoded = {**_decode_received(others, received, shapes, arch_fp, compression, rejects, max_bytes), self_id: own}
    # `combine` sums in sorted peer-id order, so every node that decoded the same payloads ends bit-identical
    params = {p: decoded[p] for p in participants if p in decoded}
    clip = robust.federated(params, rejects) if robust is not None and params else None
    mixed = clip.params if clip is not None else params
    present = [p for p in others if p in mixed]
    missing = [p for p in others if p not in mixed]
    if not mixed:
        return GossipResult(own, {self_id: 1.0}, [], missing, 0.0)
    weights = {p: 1.0 / len(mixed) for p in mixed}
    dist = consensus_distance(own, [params[p] for p in present])
    res = GossipResult(combine(weights, mixed), weights, present, missing, dist)
    if clip is not None:
        res.clipped, res.clip_radius = clip.clipped, clip.radius
    return res


def allreduce_result(allreduce: AllReduce, own: list[torch.Tensor], participants: Sequence[str],
                     me: str) -> GossipResult:
    """A federated round through hivemind's all-reduce: the group mean, or our own parameters if no group
    formed or its average failed (the all-reduce's groupmates are present, the other participants missing)."""
    others = [p for p in participants if p != me]
    if len(participants) < 2:
        return GossipResult(list(own), {me: 1.0}, [], [], 0.0)
    step = allreduce.average(own, len(participants), me)
    if step is None:
        return GossipResult(list(own), {me: 1.0}, [], others, 0.0)
    k = step.size  # others' mean = (k * mean - own) / (k - 1)
    others_mean = [(k * m - x) / max(k - 1, 1) for m, x in zip(step.mean, own, strict=True)]
    dist = params_sq_distance(own, others_mean) ** 0.5
    return GossipResult(step.mean, {p: 1.0 / k for p in [me, *step.present]}, step.present,
                        [p for p in others if p not in step.present], dist)
