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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class Bypass:
    """One gossip node's record of which neighbours it has been routing around (`after` = 0: never)."""

    def __init__(self, after: int = 3) -> None:
        if after < 0:
            raise ValueError(f"bypass_after must be >= 0, got {after}")
        self.after = after
        self.missing_rounds: dict[str, int] = {}  # neighbour -> rounds in a row it was missing (or refused)

    def routed_around(self) -> set[str]:
        """The neighbours missing for at least `after` rounds in a row."""
        if self.after == 0:
            return set()
        return {p for p, n in self.missing_rounds.items() if n >= self.after}

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

    def observe(self, present: Iterable[str], missing: Iterable[str]) -> None:
        """After a round: neighbours averaged with reset their count, missing (or refused) ones add one;
        peers that were neither (no longer our neighbours, or gone) are forgotten."""
        present, missing = set(present), set(missing)
        self.missing_rounds = {p: self.missing_rounds.get(p, 0) + 1 for p in missing - present}
