"""Who a DPO node averages with this round, and the parallel fetches of their published parameters.

Gossip mode builds the topology every round from the sorted ids of the live DPO peers with our
architecture fingerprint, so all nodes that see the same membership agree on the graph without talking.
Federated mode averages over all participants, or over S of them sampled from a seed every node shares.
The swarm object is passed in (duck-typed `SwarmPeer`), so this module needs no networking imports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from swarm_node.config import DPOConfig
from swarm_node.dpo import topology

log = logging.getLogger("swarm_node.dpo")


@dataclass
class RoundPlan:
    adjacency: np.ndarray      # over the sorted live ids
    to_fetch: list[str]        # peers whose parameters this node averages with
    participants: list[str]    # federated: the round's participants (self included if sampled); else []

    @classmethod
    def gossip(cls, adjacency: np.ndarray, ids: list[str], me: str) -> RoundPlan:
        """Fetch from our neighbours in `adjacency` (over the sorted live ids)."""
        return cls(adjacency, [ids[j] for j in np.flatnonzero(adjacency[ids.index(me)])], [])


def plan_round(d: DPOConfig, ids: list[str], me: str, round_: int) -> RoundPlan:
    """The graph and the peers to fetch from, a pure function of the live ids and the round."""
    n = len(ids)
    if d.averaging == "federated":
        participants = ids
        if d.participants_per_round is not None and d.participants_per_round < n:
            rng = np.random.default_rng([d.graph_seed, round_])
            participants = sorted(rng.choice(ids, size=d.participants_per_round, replace=False).tolist())
        return RoundPlan(topology.complete(n), [p for p in participants if p != me], participants)
    if d.averaging == "none" or n == 1:
        return RoundPlan(np.zeros((n, n), dtype=bool), [], [])
    return RoundPlan.gossip(gossip_graph(d, n), ids, me)


def gossip_graph(d: DPOConfig, n: int, graph: str | None = None) -> np.ndarray:
    """The gossip graph on n sorted peers (`graph`: another topology than the config's), widened under the
    clipped rule: robust averaging needs enough neighbours to outvote a hostile one (dpo.min_neighbours)."""
    adj = topology.adjacency(graph or d.topology, n, p=d.er_probability, seed=d.graph_seed)
    return topology.widen(adj, d.min_neighbours) if d.aggregation == "clipped" else adj


class Neighbourhood:
    """The swarm side of one DPO node: the peers it can average with, and parallel parameter fetches."""

    def __init__(self, d: DPOConfig, swarm: Any, arch_fp: str) -> None:
        self.d = d
        self.swarm = swarm
        self.arch_fp = arch_fp
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="dpo-fetch")

    @property
    def self_id(self) -> str:
        return self.swarm.peer_id if self.swarm else "self"

    def _members(self) -> list[Any]:
        return [m for m in self.swarm.live_peers() if m.mode == "dpo" and m.arch_fp == self.arch_fp]

    def peers(self) -> list[str]:
        """Sorted ids of live DPO peers with our architecture fingerprint, self included."""
        if self.swarm is None:
            return [self.self_id]
        return sorted({m.peer_id for m in self._members()} | {self.self_id})

    def peer_rounds(self) -> dict[str, int]:
        """The round each live DPO peer (other than us) last announced."""
        if self.swarm is None:
            return {}
        return {m.peer_id: m.round for m in self._members() if m.peer_id != self.self_id}

    def wait_for_peers(self, stopped: Callable[[], bool]) -> list[str]:
        end = time.monotonic() + self.d.join_wait_s
        ids = self.peers()
        while len(ids) < self.d.min_peers and time.monotonic() < end and not stopped():
            time.sleep(0.5)
            ids = self.peers()
        log.info("%d DPO peer(s) with our architecture (min_peers %d)", len(ids), self.d.min_peers)
        return ids

    def fetch_all(self, peers: list[str], round_: int) -> dict[str, bytes | None]:
        if not peers or self.swarm is None:
            return {}
        futs = {p: self.pool.submit(self.swarm.fetch, "params", p, round_, self.d.gossip_deadline_s) for p in peers}
        return {p: f.result() for p, f in futs.items()}

    def linger(self, done_round: int, neighbours: list[str]) -> None:
        """Keep serving our last params until the neighbours have finished that round too (bounded).

        A node that left at once would make slower neighbours time out on the final round.
        """
        if self.swarm is None or not neighbours:
            return
        self.swarm.set_round(done_round)
        end = time.monotonic() + self.d.gossip_deadline_s
        while time.monotonic() < end:
            rounds = {m.peer_id: m.round for m in self.swarm.live_peers()}
            if all(rounds.get(p, done_round) >= done_round for p in neighbours):
                return
            time.sleep(0.5)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.swarm is not None:
            self.swarm.close()
