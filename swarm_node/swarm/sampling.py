"""Sampled membership's pure policy: which shard keys a node writes and reads, how it picks its level, its
bounded view, and whom it pushes to. No hivemind, no I/O: the simulator drives the same code as the node.

Why: a full member list under one key makes every DHT answer grow with the swarm (docs/architecture.md,
"How the control plane scales"). Records sharded by hash prefix over 2^level keys keep answers ~SHARD_TARGET
entries at any size.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_LEVEL = 14  # 16,384 shards: ~130k peers at SHARD_TARGET
SHARD_TARGET = 8  # M: entries a shard should hold at the reader's level
SHARD_SUBKEYS = 48  # a shard key's subkey cap in BoundedStorage (Sybil-flood bound; a reply stays < 250 KB)
VIEW_SIZE = 32  # V: peers a node keeps in its passive view
PROBE_CHANCE = 0.125  # the chance that a read probes a deeper level instead of ours (LevelPolicy.read_level)


def shard_of(peer_id: bytes | str, level: int) -> int:
    """The top `level` bits of sha256(peer id)."""
    raw = peer_id.encode() if isinstance(peer_id, str) else peer_id
    top = int.from_bytes(hashlib.sha256(raw).digest()[:4], "big")
    return top >> (32 - level) if level else 0


def shard_key(swarm_id: str, level: int, shard: int) -> str:
    """The DHT key of one shard."""
    return f"{swarm_id}_m{level}_{shard}"


# ---- The interface pieces A (policy) and B (wiring) meet at: names and signatures are kept for B.


def write_keys(swarm_id: str, peer_id: bytes | str, level: int) -> list[str]:
    """The shard keys a node at `level` writes its record to: its shards at level-1, level and level+1 (clamped
    to 0..MAX_LEVEL, no duplicates), so readers whose level estimate differs by one still meet it.

    `peer_id` is the base58 string of `MemberRecord.peer_id`: the DHT's ShardGuard recomputes the shard from
    that string, and refuses a record stored under a shard its signer does not belong to."""
    levels = sorted({min(MAX_LEVEL, max(0, level + d)) for d in (-1, 0, 1)})
    return [shard_key(swarm_id, lv, shard_of(peer_id, lv)) for lv in levels]


def random_read_key(swarm_id: str, level: int, rng: random.Random) -> str:
    """A uniformly drawn shard key at `level`: what a periodic read fetches."""
    return shard_key(swarm_id, level, rng.randrange(2**level))


def _clamp(level: int) -> int:
    return min(MAX_LEVEL, max(0, level))


def initial_level(size_estimate: float) -> int:
    """A joiner's first level guess from an estimate of the swarm's size (e.g. the DHT's): the level whose
    shards hold ~SHARD_TARGET entries, 0 for swarms of up to ~1.4 SHARD_TARGET peers."""
    if not size_estimate > SHARD_TARGET:  # also NaN and negatives
        return 0
    return _clamp(round(math.log2(min(size_estimate, 2.0**64) / SHARD_TARGET)))


class LevelPolicy:
    """The node's shard level: adjusted after each read from the entries seen and their writers' levels.

    Rules, in order, after a read of c entries at level x (M = SHARD_TARGET):
      1. most writers agree on a level y != x: step one toward y, provided the count allows it (a step
         deeper halves the shard, so needs c >= M; a step shallower doubles it, so needs c <= M);
      2. else c > 2M: one deeper;
      3. else c < M/2 and x > 0: one shallower, unless most writers are deeper than x.
    Why the proviso on rule 1: without it a swarm that sits too shallow barely moves when its nodes move one
    at a time (as their reads, spread over the heartbeat, make them): the first node to go deeper reads the
    others as a majority one level up and steps straight back (tests/test_sampling.py measures it). With it,
    a node follows the writers only where its own shard would still hold M/2..2M entries, so laggards join
    the consensus and the consensus can still move.
    Why the proviso on rule 3: a node two levels shallower than every writer reads no one at all, and nothing
    brings it back; a sparse read whose writers sit deeper is noise, not a sign to move further away.
    """

    def __init__(self, level: int = 0, smoothing: float = 0.25) -> None:
        self.level = _clamp(level)
        self.smoothing = smoothing  # weight of the newest read in the size estimate
        self._size: float | None = None

    def read_level(self, rng: random.Random) -> int:
        """The level of the next read: ours, or with probability PROBE_CHANCE a probe at a random deeper level
        (two or more below ours). Why: a group of g peers that drifted two or more levels above every other
        writer sees only itself, and settles at log2(g/M) as a partition of its own; a probe that finds the
        rest of the swarm brings it back (`observe` with the probe's level)."""
        if self.level + 2 <= MAX_LEVEL and rng.random() < PROBE_CHANCE:
            return rng.randint(self.level + 2, MAX_LEVEL)
        return self.level

    def observe(self, entries: int, writer_levels: Sequence[int], read_level: int | None = None) -> int:
        """Feed one shard read (entries found, and the level each writer recorded); returns the new level.
        `read_level`: the level read, when it was a probe (`read_level()`) rather than ours."""
        if read_level is not None and read_level != self.level:
            return self._probed(read_level, entries, writer_levels)
        x = self.level
        sample = entries * 2.0**x
        self._size = sample if self._size is None else self._size + self.smoothing * (sample - self._size)
        step, y = 0, x
        if writer_levels:
            top, votes = Counter(writer_levels).most_common(1)[0]
            y = top if 2 * votes > len(writer_levels) else x
        if y > x and entries >= SHARD_TARGET:
            step = 1
        elif y < x and entries <= SHARD_TARGET:
            step = -1
        elif entries > 2 * SHARD_TARGET:
            step = 1
        elif 2 * entries < SHARD_TARGET and x > 0 and y <= x:
            step = -1
        self.level = _clamp(x + step)
        return self.level

    def _probed(self, level: int, entries: int, writer_levels: Sequence[int]) -> int:
        """A probe found writers two or more levels deeper than us: join their majority level."""
        if entries and writer_levels:
            y, votes = Counter(writer_levels).most_common(1)[0]
            if 2 * votes > len(writer_levels) and y > self.level + 1:
                self.level = _clamp(y)
        return self.level

    def size_estimate(self) -> float:
        """N-hat: the smoothed entries-per-shard times 2^level (for status and docs); 0 before any read."""
        return self._size or 0.0


@dataclass
class _Seen:
    record: object
    updated: float  # the record's own time (its writer's clock, as read)
    contact: float  # the last push that got through, either way (-inf: none)
    rank: int  # 0 established, 1 warming, 2 stranger

    def fresh_until(self, ttl_s: float) -> float:
        return max(self.updated, self.contact) + ttl_s


class ViewBook:
    """A bounded passive view: peer id -> (record, last update, last contact, rank). Expiry at updated + ttl
    unless a push went either way within ttl; when full, evicts its oldest stranger (rank 2), never a rank 0/1
    peer, and refuses a newcomer when every entry is rank 0/1.

    Why bounded: at 10,000 peers the view must not grow with what reads and pushers show us (rule 4)."""

    def __init__(self, capacity: int = VIEW_SIZE, ttl_s: float = 60.0) -> None:
        if capacity < 1:
            raise ValueError("a view holds at least one peer")
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._seen: dict[str, _Seen] = {}

    def add(self, peer_id: str, record: object, updated: float, now: float, rank: int = 2) -> bool:
        """Note a peer's record (from a shard read or a push); False if it was not kept (stale, or the view is
        full of rank 0/1 peers). A listed peer keeps its newer record; its rank is always updated."""
        rank = min(2, max(0, rank))
        held = self._seen.get(peer_id)
        if held is not None:
            if updated >= held.updated:
                held.record, held.updated = record, updated
            held.rank = rank
            return True
        if updated + self.ttl_s < now:
            return False
        if len(self._seen) >= self.capacity:
            self.expire(now)
        if len(self._seen) >= self.capacity:
            strangers = [(e.fresh_until(self.ttl_s), pid) for pid, e in self._seen.items() if e.rank >= 2]
            if not strangers:
                return False
            del self._seen[min(strangers)[1]]
        self._seen[peer_id] = _Seen(record, updated, float("-inf"), rank)
        return True

    def touch(self, peer_id: str, now: float) -> None:
        """A push got through, either way: the peer stays for another ttl."""
        held = self._seen.get(peer_id)
        if held is not None:
            held.contact = max(held.contact, now)

    def set_rank(self, peer_id: str, rank: int) -> None:
        held = self._seen.get(peer_id)
        if held is not None:
            held.rank = min(2, max(0, rank))

    def remove(self, peer_id: str) -> None:
        self._seen.pop(peer_id, None)

    def expire(self, now: float) -> list[str]:
        """Drop the peers neither updated nor in contact within ttl; returns their ids."""
        gone = [pid for pid, e in self._seen.items() if e.fresh_until(self.ttl_s) < now]
        for pid in gone:
            del self._seen[pid]
        return gone

    def peers(self) -> list[str]:
        return list(self._seen)

    def record(self, peer_id: str) -> object | None:
        held = self._seen.get(peer_id)
        return held.record if held is not None else None

    def rank(self, peer_id: str) -> int | None:
        held = self._seen.get(peer_id)
        return held.rank if held is not None else None

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._seen


def pick_targets(candidates: Sequence[str], rank: Callable[[str], int], fanout: int,
                 rng: random.Random) -> list[str]:
    """F push targets: fanout-1 by rank (0 established, 1 warming, 2 stranger; random within a rank), plus one
    exploration slot drawn from ranks 1-2 (falls back to rank 0 if none). No duplicates; with at most `fanout`
    candidates, all of them.

    Why ranks: at 10,000 peers a random target is a stranger, whose batches a newcomer gate caps; sticky pushes
    to established peers make pushing mutual, and the exploration slot lets strangers become established."""
    unique = list(dict.fromkeys(candidates))
    if fanout <= 0:
        return []
    if len(unique) <= fanout:
        rng.shuffle(unique)
        return unique
    by_rank: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for pid in unique:
        by_rank[min(2, max(0, rank(pid)))].append(pid)
    for group in by_rank.values():
        rng.shuffle(group)
    ordered = by_rank[0] + by_rank[1] + by_rank[2]
    chosen = ordered[: fanout - 1]
    taken = set(chosen)
    explore = [pid for pid in by_rank[1] + by_rank[2] if pid not in taken]
    if not explore:
        explore = [pid for pid in by_rank[0] if pid not in taken]
    chosen.append(rng.choice(explore))
    return chosen
