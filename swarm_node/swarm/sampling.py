"""Sampled membership's pure policy: which shard keys a node writes and reads, how it picks its level, its
bounded view, and whom it pushes to. No hivemind, no I/O: the simulator drives the same code as the node.

Why: a full member list under one key makes every DHT answer grow with the swarm (docs/architecture.md,
"How the control plane scales"). Records sharded by hash prefix over 2^level keys keep answers ~SHARD_TARGET
entries at any size.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

MAX_LEVEL = 14  # 16,384 shards: ~130k peers at SHARD_TARGET
SHARD_TARGET = 8  # M: entries a shard should hold at the reader's level
SHARD_SUBKEYS = 48  # a shard key's subkey cap in BoundedStorage (Sybil-flood bound; a reply stays < 250 KB)
VIEW_SIZE = 32  # V: peers a node keeps in its passive view


def shard_of(peer_id: bytes | str, level: int) -> int:
    """The top `level` bits of sha256(peer id)."""
    raw = peer_id.encode() if isinstance(peer_id, str) else peer_id
    top = int.from_bytes(hashlib.sha256(raw).digest()[:4], "big")
    return top >> (32 - level) if level else 0


def shard_key(swarm_id: str, level: int, shard: int) -> str:
    """The DHT key of one shard."""
    return f"{swarm_id}_m{level}_{shard}"


# Piece A fills in: write_keys(swarm_id, peer_id, level) -> the keys at level-1, level, level+1;
# LevelPolicy; ViewBook; pick_targets (see /work/notes/issue41-design.md §2).

# ---- The interface pieces A (policy) and B (wiring) meet at. A owns the bodies and may refine them, but keeps
# these names and signatures (B codes against them).


def write_keys(swarm_id: str, peer_id: bytes | str, level: int) -> list[str]:
    """The shard keys a node at `level` writes its record to: its shards at level-1, level and level+1 (clamped
    to 0..MAX_LEVEL, no duplicates), so readers whose level estimate differs by one still meet it."""
    levels = sorted({min(MAX_LEVEL, max(0, level + d)) for d in (-1, 0, 1)})
    return [shard_key(swarm_id, lv, shard_of(peer_id, lv)) for lv in levels]


def random_read_key(swarm_id: str, level: int, rng: random.Random) -> str:
    """A uniformly drawn shard key at `level`: what a periodic read fetches."""
    return shard_key(swarm_id, level, rng.randrange(2**level))


def initial_level(size_estimate: float) -> int:
    """A joiner's first level guess from an estimate of the swarm's size (e.g. the DHT's)."""
    raise NotImplementedError  # piece A


class LevelPolicy:
    """The node's shard level: adjusted after each read from the entries seen and their writers' levels."""

    def __init__(self, level: int = 0) -> None:
        self.level = level

    def observe(self, entries: int, writer_levels: Sequence[int]) -> int:
        """Feed one shard read (entries found, and the level each writer recorded); returns the new level."""
        raise NotImplementedError  # piece A

    def size_estimate(self) -> float:
        """N-hat: the smoothed entries-per-shard times 2^level (for status and docs)."""
        raise NotImplementedError  # piece A


class ViewBook:
    """A bounded passive view: peer id -> (record, last update, last contact). Expiry at updated + ttl unless a
    push went either way within ttl; when full, evicts its oldest stranger (rank 2), never a rank 0/1 peer."""

    def __init__(self, capacity: int = VIEW_SIZE, ttl_s: float = 60.0) -> None:
        raise NotImplementedError  # piece A

    def add(self, peer_id: str, record: object, updated: float, now: float, rank: int = 2) -> bool: ...
    def touch(self, peer_id: str, now: float) -> None: ...  # a push got through, either way
    def expire(self, now: float) -> list[str]: ...  # ids dropped
    def peers(self) -> list[str]: ...
    def record(self, peer_id: str) -> object | None: ...
    def __len__(self) -> int: ...


def pick_targets(candidates: Sequence[str], rank: Callable[[str], int], fanout: int,
                 rng: random.Random) -> list[str]:
    """F push targets: fanout-1 by rank (0 established, 1 warming, 2 stranger; random within a rank), plus one
    exploration slot drawn from ranks 1-2 (falls back to rank 0 if none)."""
    raise NotImplementedError  # piece A
