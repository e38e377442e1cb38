"""Routing a gossip graph around a neighbour that has stopped counting: silent, or refused every round.

A ring node whose neighbour sends nothing, or parameters the robust rule refuses, averages with one
neighbour only, and the ring becomes a path: measured on 8 nodes (benchmarks/dpo_byzantine.py), the worst
honest node then ends 35 points of held-out preference accuracy below the full ring, whatever the
averaging rule. `Bypass` keeps one node's count of the rounds each neighbour has been missing in a row;
once a neighbour has been missing `after` rounds, the node also averages with that neighbour's own graph
neighbours (and, if one of those is missing too, with theirs), until it is back. On a ring the two nodes
beside a refused one then link to each other, and the ring closes around it.

Nothing is agreed with anyone: each node decides from what it received. When both sides of a missing node
route around it (a silent node is missing for all its neighbours alike), the added edge is in both their
graphs and, with the missing node removed, their Metropolis-Hastings rows are those of the graph without
it. When only one side does (an attacker that sends good parameters to one neighbour and bad ones to the
other), the new link is one-way: the averages of the two sides are no longer symmetric, which moves the
consensus point a little but not its existence. We still fetch from the missing neighbour every round, so
it is back in the average (and the extra links gone) the first round it is accepted again.

A neighbour can also stop us without ever being refused: a dissensus attacker (He, Karimireddy & Jaggi
2022) sends each of its neighbours the point that cancels that node's pull towards its honest
neighbours. On a ring (two neighbours, one of them the attacker) nothing tells the two apart, and the
node stays where its own data takes it (measured: the attacker's two neighbours end at chance, and their
other neighbours then refuse them). What does show is that averaging no longer moves the node:
`pull_ratio` (dpo/mixing.py) is about 0.7 between honest neighbours and 0 under this attack. After
`after` rounds in a row with a ratio under `stall_ratio`, the node also averages with the graph
neighbours of every neighbour it averaged with, for STALL_HOLD rounds: on a ring, two more honest nodes,
whose pulls one point can no longer cancel within the clip radius. Like routing around, it only adds
links; a false alarm costs the bytes of a few more fetches for STALL_HOLD rounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from swarm_node.config import DPOConfig

STALL_HOLD = 20  # rounds the extra links of a stalled node stay after its last stalled run


class Bypass:
    """One gossip node's record of which neighbours it has been routing around (`after` = 0: never)."""

    def __init__(self, after: int = 3, stall_ratio: float = 0.0) -> None:
        if after < 0:
            raise ValueError(f"bypass_after must be >= 0, got {after}")
        if not 0.0 <= stall_ratio < 1.0:
            raise ValueError(f"stall_ratio must be in [0, 1), got {stall_ratio}")
        self.after = after
        self.stall_ratio = stall_ratio
        self.missing_rounds: dict[str, int] = {}  # neighbour -> rounds in a row it was missing (or refused)
        self.stalled_rounds = 0  # rounds in a row whose pull ratio was under stall_ratio
        self.widened: set[str] = set()  # neighbours we also route around because averaging stalled
        self.widened_left = 0  # rounds until those extra links go

    @classmethod
    def from_config(cls, d: DPOConfig) -> Bypass:
        """A gossip node's bypass: stalls are watched under the clipped rule only, because the pull ratio
        that detects them is measured on the clipped distances (plain averaging has no such measurement)."""
        return cls(d.bypass_after, d.stall_ratio if d.aggregation == "clipped" else 0.0)

    def routed_around(self) -> set[str]:
        """The neighbours missing for at least `after` rounds in a row, and those of a stall (for its hold)."""
        if self.after == 0:
            return set()
        missing = {p for p, n in self.missing_rounds.items() if n >= self.after}
        return missing | (self.widened if self.widened_left > 0 else set())

    def adjacency(self, adjacency: np.ndarray, ids: Sequence[str], self_id: str) -> np.ndarray:
        """`adjacency` plus links from us to the graph neighbours of every neighbour we route around.

        Repeated until nothing changes, so a run of missing nodes is crossed too (one more hop per
        neighbour on the way that has itself been missing `after` rounds).
        """
        around = self.routed_around()
        if not around:
            return adjacency
        base = np.asarray(adjacency, dtype=bool)
        out = base.copy()
        me = list(ids).index(self_id)
        idx = {p: i for i, p in enumerate(ids)}
        done: set[int] = set()
        while True:
            todo = [idx[p] for p in around if p in idx and out[me, idx[p]] and idx[p] not in done]
            if not todo:
                return out
            for j in todo:
                done.add(j)
                for k in np.flatnonzero(base[j]):
                    if k != me:
                        out[me, k] = out[k, me] = True

    def observe(self, present: Iterable[str], missing: Iterable[str], pull_ratio: float | None = None) -> bool:
        """After a round: neighbours averaged with reset their count, missing (or refused) ones add one;
        peers that were neither (no longer our neighbours, or gone) are forgotten. `pull_ratio` (robust
        gossip) counts stalled rounds; True when this round completed a stalled run (the links widen)."""
        present, missing = set(present), set(missing)
        self.missing_rounds = {p: self.missing_rounds.get(p, 0) + 1 for p in missing - present}
        self.widened_left = max(0, self.widened_left - 1)
        stalled = pull_ratio is not None and len(present) >= 2 and pull_ratio < self.stall_ratio
        self.stalled_rounds = self.stalled_rounds + 1 if stalled else 0
        if self.after == 0 or self.stalled_rounds < self.after:
            return False
        self.widened = (self.widened if self.widened_left else set()) | present
        self.widened_left = STALL_HOLD
        self.stalled_rounds = 0
        return True
