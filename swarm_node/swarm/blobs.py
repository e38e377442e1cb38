"""What a peer serves: its own blobs of each kind (rollout batches, DPO parameters) for its last rounds."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from swarm_node.swarm.records import KINDS, MAX_ANNOUNCED_ROUNDS, BlobEntry


def describe(round_: int, payload: bytes) -> BlobEntry:
    """The entry that announces `payload` as round `round_`: its size and sha256."""
    return BlobEntry(round=int(round_), size=len(payload), sha256=hashlib.sha256(payload).hexdigest())


class BlobStore:
    """Our blobs by kind and round, the newest `keep` rounds of each kind.

    Owns: the payloads and the entries that announce them.
    May call: records (entry type, kinds) only.
    Thread: any (one lock). The blob handler reads it on the loop thread; the round loop writes it.
    """

    def __init__(self, keep: int) -> None:
        self.keep = min(max(1, int(keep)), MAX_ANNOUNCED_ROUNDS)
        self._blobs: dict[str, OrderedDict[int, tuple[bytes, BlobEntry]]] = {k: OrderedDict() for k in KINDS}
        self._lock = threading.Lock()

    def put(self, kind: str, entry: BlobEntry, payload: bytes) -> BlobEntry:
        """Serve `payload` under `entry` (normally `describe(round, payload)`); the oldest round beyond
        `keep` is dropped."""
        with self._lock:
            kept = self._blobs[kind]
            kept[entry.round] = (payload, entry)
            kept.move_to_end(entry.round)
            while len(kept) > self.keep:
                kept.popitem(last=False)
        return entry

    def payload(self, kind: str, round_: int) -> bytes | None:
        with self._lock:
            item = self._blobs.get(kind, {}).get(round_)
        return item[0] if item else None

    def served(self, kind: str, round_: int) -> tuple[bytes, bytes] | None:
        """(payload, its sha256 digest as announced) for the blob handler: the digest was computed once,
        when the blob was put, so serving it again hashes nothing."""
        with self._lock:
            item = self._blobs.get(kind, {}).get(round_)
        return (item[0], bytes.fromhex(item[1].sha256)) if item else None

    def entries(self, kind: str) -> list[BlobEntry]:
        with self._lock:
            return [e for _p, e in self._blobs[kind].values()]

    def drop(self, kind: str, round_: int) -> None:
        """Stop serving one round (it stays in DHT announcements until the next store)."""
        with self._lock:
            self._blobs[kind].pop(round_, None)
