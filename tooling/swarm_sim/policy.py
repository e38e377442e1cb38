"""The sampled membership's pure policy, as the simulator uses it: swarm_node.swarm.sampling where its bodies
exist, else a local stand-in.

TEMPORARY FALLBACK (issue 41): piece A implements initial_level, LevelPolicy, ViewBook and pick_targets in
swarm_node/swarm/sampling.py in parallel; on main they raise NotImplementedError. Everything below the
marked line is the stand-in, written from the signatures and docstrings there and design §2.1/§2.5; the
lead deletes it at merge and `REAL_POLICY` becomes True. The simulator reports which one it ran.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from swarm_node.swarm import sampling
from swarm_node.swarm.sampling import MAX_LEVEL, SHARD_SUBKEYS, SHARD_TARGET, VIEW_SIZE, shard_of, write_keys

__all__ = ["MAX_LEVEL", "SHARD_SUBKEYS", "SHARD_TARGET", "VIEW_SIZE", "shard_of", "write_keys", "initial_level",
           "LevelPolicy", "ViewBook", "pick_targets", "REAL_POLICY"]


def _real_policy_works() -> bool:
    try:
        sampling.initial_level(100.0)
        sampling.LevelPolicy(0).observe(8, [0] * 8)
        sampling.ViewBook(4, 60.0)
        sampling.pick_targets(["a", "b"], lambda _p: 2, 1, random.Random(0))
    except NotImplementedError:
        return False
    return True


REAL_POLICY = _real_policy_works()

# ---------------------------------------------------------------- stand-in (delete at merge) -------------


def _initial_level(size_estimate: float) -> int:
    """The level whose shards hold ~SHARD_TARGET of `size_estimate` peers."""
    if size_estimate <= SHARD_TARGET:
        return 0
    return max(0, min(MAX_LEVEL, round(math.log2(size_estimate / SHARD_TARGET))))


class _LevelPolicy:
    """Design §2.1's three rules: follow agreeing writers, else split above 2M entries, else merge below M/2."""

    def __init__(self, level: int = 0) -> None:
        self.level = level
        self._per_shard = float(SHARD_TARGET)

    def observe(self, entries: int, writer_levels: Sequence[int]) -> int:
        self._per_shard += 0.25 * (entries - self._per_shard)
        x = self.level
        if writer_levels:
            y = max(set(writer_levels), key=list(writer_levels).count)
            if y != x and list(writer_levels).count(y) * 2 > len(writer_levels):
                self.level = x + (1 if y > x else -1)
                return self.level
        if entries > 2 * SHARD_TARGET and x < MAX_LEVEL:
            self.level = x + 1
        elif entries < SHARD_TARGET / 2 and x > 0:
            self.level = x - 1
        return self.level

    def size_estimate(self) -> float:
        return self._per_shard * 2**self.level


class _ViewBook:
    """Bounded view: expiry at updated + ttl unless a push went either way within ttl; evicts the oldest
    stranger when full, never a rank 0/1 peer."""

    def __init__(self, capacity: int = VIEW_SIZE, ttl_s: float = 60.0) -> None:
        self.capacity, self.ttl_s = capacity, ttl_s
        self._e: dict[str, list] = {}  # id -> [record, updated, last contact, rank]

    def add(self, peer_id: str, record: object, updated: float, now: float, rank: int = 2) -> bool:
        e = self._e.get(peer_id)
        if e is not None:
            e[0], e[1], e[3] = record, max(e[1], updated), min(e[3], rank)
            return True
        if len(self._e) >= self.capacity:
            strangers = [(v[1], p) for p, v in self._e.items() if v[3] >= 2]
            if not strangers:
                return False
            del self._e[min(strangers)[1]]
        self._e[peer_id] = [record, updated, -math.inf, rank]
        return True

    def touch(self, peer_id: str, now: float) -> None:
        e = self._e.get(peer_id)
        if e is not None:
            e[2] = now

    def expire(self, now: float) -> list[str]:
        gone = [p for p, e in self._e.items() if max(e[1], e[2]) + self.ttl_s < now]
        for p in gone:
            del self._e[p]
        return gone

    def peers(self) -> list[str]:
        return list(self._e)

    def record(self, peer_id: str) -> object | None:
        e = self._e.get(peer_id)
        return None if e is None else e[0]

    def __len__(self) -> int:
        return len(self._e)


def _pick_targets(candidates: Sequence[str], rank: Callable[[str], int], fanout: int,
                  rng: random.Random) -> list[str]:
    """fanout-1 by rank (random within a rank), plus one exploration slot from ranks 1-2 (else rank 0)."""
    if fanout <= 0 or not candidates:
        return []
    by_rank: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for c in candidates:
        by_rank[min(2, max(0, rank(c)))].append(c)
    for group in by_rank.values():
        rng.shuffle(group)
    ordered = by_rank[0] + by_rank[1] + by_rank[2]
    picked = ordered[:fanout - 1]
    rest = [c for c in by_rank[1] + by_rank[2] if c not in picked] or [c for c in ordered if c not in picked]
    if rest:
        picked.append(rng.choice(rest))
    return picked


if REAL_POLICY:
    initial_level, LevelPolicy, ViewBook, pick_targets = (sampling.initial_level, sampling.LevelPolicy,
                                                          sampling.ViewBook, sampling.pick_targets)
else:
    initial_level, LevelPolicy, ViewBook, pick_targets = _initial_level, _LevelPolicy, _ViewBook, _pick_targets
