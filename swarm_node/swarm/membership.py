"""A peer's signed records in the DHT (membership, blob announcements), and reading everyone's.

All peers' member records are subkeys of one DHT key, and every DHT node that holds that key answers a
lookup of it with the whole dictionary, so a store or a `latest=True` read costs O(swarm) bytes. So the
record is re-stored only every max(record_ttl_s / 3, heartbeat_s x N/8) seconds (with an expiry of 3
such periods), and the member list is read every heartbeat up to VIEW_READ_PEERS peers and
proportionally less often beyond: the bytes per second of both stay flat as the swarm grows
(docs/architecture.md, "The exchange"; newcomers are learnt sooner from their pushes anyway).

Most reads take one copy (`latest=False`), and a node that is itself a replica of the key takes its own:
a copy that lacks every peer which cannot reach this node (two peers behind different NATs) or whose
store went to other replicas. So once per store period the read merges the copies of the replicas a
store's lookup finds (`latest=True`, the store's beam), and only such a read forgets peers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from hivemind.utils.serializer import MSGPackSerializer

from swarm_node.config import SwarmConfig
from swarm_node.swarm.blobs import BlobStore
from swarm_node.swarm.counters import SwarmCounters
from swarm_node.swarm.records import (
    KINDS,
    Announcement,
    BlobEntry,
    MemberRecord,
    blobs_key,
    members_key,
    own_member_record,
    parse_signed,
)
from swarm_node.swarm.supervisor import DHTSupervisor

VIEW_READ_PEERS = 8  # membership is read every heartbeat up to this many peers, proportionally less often beyond
MEMBER_REFRESHES_PER_TTL = 3  # the membership record is re-stored 3 times per TTL (lives through 2 misses)
STORE_BEAM = 4
"""Beam width of the Kademlia lookup before a store (hivemind's default is the bucket size, 20). Every
node that lookup visits and that holds the key answers with the whole value: for the membership key,
one record per peer, so below 20 peers a store cost O(swarm^2) bytes. A beam just above DHT_REPLICAS
still finds the replicas' nodes and visits a bounded number of holders."""


@dataclass
class PeerInfo:
    """What this node tells the swarm about itself (so peers can decline what they cannot use)."""

    mode: str
    model_name: str
    tokenizer_fp: str
    task_id: str
    arch_fp: str = ""


class Membership:
    """This peer's records in the DHT, and the signed records of the others.

    Owns: the member record we sign (PeerInfo plus our current round), the DHT announcements of the blobs
    we keep, when each is re-stored and when the member list is read next (the schedule above), reading
    signed records (each bound to the key that signed it), and withdrawing ours when we leave.
    May call: DHTSupervisor.call, records, SwarmCounters (control bytes; bad records). Not the view.
    Thread: stores and scheduled reads on the heartbeat thread; reads also from the round loop
    (`live_peers`, lockstep) and from the loop thread's executor (`read_announcements`, for `fetch`).
    """

    def __init__(self, cfg: SwarmConfig, info: PeerInfo, dht: DHTSupervisor, counters: SwarmCounters,
                 log: logging.Logger) -> None:
        self.cfg = cfg
        self.info = info
        self.dht = dht
        self.counters = counters
        self.log = log
        self.round = 0
        self._next_member_store = 0.0  # monotonic times the membership / batch DHT records are due
        self._next_batch_store = 0.0
        self._next_read = 0.0
        self._next_full_read = 0.0
        self._members_read: tuple[float, dict[str, MemberRecord]] = (float("-inf"), {})  # last read that worked

    # ---- our records ----

    def record(self) -> MemberRecord:
        return own_member_record(self.dht.peer_id, self.info, self.round, self.cfg.client_mode)

    def store_due(self, now: float, view_size: int, blobs: BlobStore) -> None:
        """Store what is due at monotonic time `now`: the member record and the batch DHT record on their
        schedule, the parameters' announcement every time (DPO neighbours poll it for their round)."""
        period = self.refresh_period(view_size)
        ttl = max(self.cfg.record_ttl_s, MEMBER_REFRESHES_PER_TTL * period)
        # first what neighbours are waiting on (after a DHT restart, a DPO round's parameters)
        self.announce("params", blobs.entries("params"))
        if now >= self._next_member_store:
            if self._store(members_key(self.cfg.swarm_id), self.record().model_dump(), ttl=ttl):
                self._next_member_store = now + period - 0.5
        # the batch DHT record is for `status` and tools only (peers learn of batches by push); it is one
        # key with a subkey per peer as well, so it follows the same schedule
        if now >= self._next_batch_store:
            entries = blobs.entries("batch")
            if entries:
                self.announce("batch", entries, ttl=ttl)
                self._next_batch_store = now + period - 0.5

    def refresh_period(self, view_size: int) -> float:
        """Seconds between stores of our member record, and between full member-list reads."""
        return max(self.cfg.record_ttl_s / MEMBER_REFRESHES_PER_TTL,
                   self.cfg.heartbeat_s * max(1.0, view_size / VIEW_READ_PEERS))

    def store_all_now(self) -> None:
        """Make every record due at once (after the DHT child was restarted)."""
        self._next_member_store = self._next_batch_store = 0.0

    def announce(self, kind: str, entries: list[BlobEntry], ttl: float | None = None) -> None:
        if not entries:
            return
        value = {"peer_id": self.dht.peer_id, "updated": float(time.time()), "blobs": [e.model_dump() for e in entries]}
        self._store(blobs_key(self.cfg.swarm_id, kind), value, ttl=ttl)

    def withdraw(self) -> None:
        """Overwrite our records with None so peers stop listing us before the TTL runs out."""
        keys = [members_key(self.cfg.swarm_id)] + [blobs_key(self.cfg.swarm_id, k) for k in KINDS]
        for key in keys:
            try:
                self.dht.call("store", key, None, time.time() + self.cfg.record_ttl_s, subkey=self.dht.subkey)
            except Exception as exc:
                self.log.debug("withdrawing %s: %s", key, exc)

    def _store(self, key: str, value, ttl: float | None = None) -> bool:
        self.counters.add("control_bytes_out", len(key) + len(self.dht.subkey) + len(MSGPackSerializer.dumps(value)))
        try:
            ok = self.dht.call("store", key, value, time.time() + (ttl or self.cfg.record_ttl_s),
                               subkey=self.dht.subkey, beam_size=STORE_BEAM)
        except Exception as exc:
            self.log.warning("storing %s failed (will retry on the next heartbeat): %s", key, exc)
            return False
        if not ok:
            self.log.debug("storing %s was not accepted by any DHT peer", key)
        return bool(ok)

    # ---- everyone's records ----

    def read_due(self, now: float) -> bool:
        return now >= self._next_read

    def full_read_due(self, now: float) -> bool:
        """Is the read due at `now` one that merges the replicas' copies (once per store period)?"""
        return now >= self._next_full_read

    def read_done(self, now: float, view_size: int, full: bool = False) -> None:
        """Schedule the next member-list read after one at `now`, by the view's size after it."""
        self._next_read = now + self.cfg.heartbeat_s * max(1.0, view_size / VIEW_READ_PEERS) - 0.5
        if full:
            self._next_full_read = now + self.refresh_period(view_size) - 0.5

    def live_peers(self) -> list[MemberRecord]:
        """Members with an unexpired heartbeat, self included."""
        members = self.read_members()
        if self.dht.peer_id not in members:
            members[self.dht.peer_id] = self.record()
        return sorted(members.values(), key=lambda m: m.peer_id)

    def read_members(self, latest: bool = True, beam_size: int | None = None) -> dict[str, MemberRecord]:
        """Everyone's member records: one copy, or (latest) the replicas' copies merged, from a lookup of
        `beam_size` (hivemind's default, 20, when None).

        A read that fails (our DHT child is down or restarting) answers with the last read that worked,
        for up to a record TTL, as the records it held are still live for that long. An empty answer made
        a DPO node whose DHT child had died average with nobody and run its rounds alone, ahead of its
        neighbours, until the round they next asked it for was one it no longer kept
        (benchmarks/dht_recovery.py --exchange dpo: 4 of 10 kills lost a round at both neighbours).
        """
        found = self._read_signed(members_key(self.cfg.swarm_id), MemberRecord, latest=latest, beam_size=beam_size)
        now = time.monotonic()
        if found is not None:
            self._members_read = (now, dict(found))
            return found
        when, last = self._members_read
        return dict(last) if now - when < self.cfg.record_ttl_s else {}

    def read_announcements(self, kind: str) -> dict[str, Announcement]:
        return self._read_signed(blobs_key(self.cfg.swarm_id, kind), Announcement) or {}

    def _read_signed(self, key: str, model, latest: bool = True, beam_size: int | None = None) -> dict | None:
        """Entries under `key` whose record names the peer id of the key that signed it; None if the read
        failed (an empty dict is a read that found nothing).

        latest=True asks every DHT node near the key (each answers with the whole dictionary: cost grows
        with the square of the swarm while it is below the bucket size); latest=False takes the first
        replica's copy (one answer), enough for peer sampling.
        """
        try:
            extra = {} if beam_size is None else {"beam_size": beam_size}
            found = self.dht.call("get", key, latest=latest, **extra)
        except Exception as exc:
            self.log.debug("reading %s failed: %s", key, exc)
            return None
        value = found.value if found is not None else None
        self.counters.add("control_bytes_in", _dht_value_size(value))
        found_records, problems = parse_signed(value, model)
        self.counters.reject_records(key, problems)
        return found_records


def _dht_value_size(value) -> int:
    """Application-level size of a DHT read (subkeys + serialized values; RPC framing not included)."""
    n = 0
    if isinstance(value, dict):
        for subkey, item in value.items():
            raw = getattr(item, "value", None)
            n += (len(subkey) if isinstance(subkey, bytes) else 0) + len(MSGPackSerializer.dumps(raw))
    return n
