"""Sampled membership's pure policy: which shard keys a node writes and reads, how it picks its level, its
bounded view, and whom it pushes to. No hivemind, no I/O: the simulator drives the same code as the node.

Why: a full member list under one key makes every DHT answer grow with the swarm (docs/architecture.md,
"How the control plane scales"). Records sharded by hash prefix over 2^level keys keep answers ~SHARD_TARGET
entries at any size.
"""

from __future__ import annotations

import hashlib

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
