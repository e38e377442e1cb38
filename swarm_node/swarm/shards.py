"""Sampled membership over the network: our record in a few shard keys, and a random shard read now and then.

Full membership (membership.py) keeps every member under one key, so every answer about it grows with the
swarm. Here member records are sharded by hash prefix over 2^level keys (swarm.sampling's policy): a node
writes its record to its shards at three adjacent levels every P = record_ttl_s / 3 (fixed: nothing here
grows with the swarm), and every READ_EVERY_BEATS heartbeats reads one random shard at its level, with the
quiet DHT operations (dht.quiet_store / quiet_read), which never fetch a key's whole dictionary. What a read
finds feeds the peer's bounded view and the level policy. There is no batch DHT record: peers learn of
batches by push, and no GRPO code reads it.
"""

from __future__ import annotations

import logging
import random
import time

from hivemind.utils.serializer import MSGPackSerializer

from swarm_node.config import SwarmConfig
from swarm_node.swarm import sampling
from swarm_node.swarm.blobs import BlobStore
from swarm_node.swarm.counters import SwarmCounters
from swarm_node.swarm.dht import dht_size_estimate, quiet_read, quiet_store
from swarm_node.swarm.records import (
    KINDS,
    Announcement,
    BlobEntry,
    MemberRecord,
    blobs_key,
    own_member_record,
    parse_signed,
)
from swarm_node.swarm.supervisor import DHTSupervisor

READ_EVERY_BEATS = 2  # one random shard read every 2 heartbeats (10 s by default)
STORES_PER_TTL = 3  # our record is re-stored 3 times per record TTL (lives through 2 misses)
MAX_KNOWN = 4 * sampling.VIEW_SIZE  # records kept from reads, for live_peers (bounded whatever a shard holds)


def membership_kind(setting: str, mode: str) -> str:
    """'full' or 'sampled' for `swarm.membership` (auto: sampled for GRPO, full for DPO, whose topology needs
    every member)."""
    if setting in ("full", "sampled"):
        return setting
    return "full" if mode == "dpo" else "sampled"


class ShardedMembership:
    """This peer's record in its shard keys, and the records of a random shard read now and then.

    The same interface the peer uses on membership.Membership (store_due, read_due, read_members, ...).
    Owns: the member record we sign (with our level), the level policy, when the record is re-stored and
    the next shard read, the records read lately (bounded, for `live_peers`), and the DHT announcements of
    the blobs we keep (DPO's parameters, as in full membership).
    May call: dht.quiet_store / quiet_read through DHTSupervisor.call, sampling, records, SwarmCounters.
    Thread: stores and scheduled reads on the heartbeat thread; reads also from the round loop and from the
    loop thread's executor (`read_announcements`).
    """

    def __init__(self, cfg: SwarmConfig, info, dht: DHTSupervisor, counters: SwarmCounters,
                 log: logging.Logger, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.info = info
        self.dht = dht
        self.counters = counters
        self.log = log
        self.round = 0
        self.policy = sampling.LevelPolicy(0)
        self.rng = rng or random.Random()
        self._next_member_store = 0.0
        self._next_read = 0.0
        self._written: set[str] = set()  # shard keys our record went to (withdraw clears them)
        self._members_read: tuple[float, dict[str, MemberRecord]] = (float("-inf"), {})
        self._known: dict[str, MemberRecord] = {}  # records from recent reads, newest last (bounded)

    def guess_level(self) -> None:
        """A joiner's first level, from the DHT's size as our routing table sees it (sampling.initial_level);
        later reads correct it."""
        try:
            level = sampling.initial_level(dht_size_estimate(self.dht.call))
        except Exception as exc:
            self.log.debug("estimating the DHT's size: %s", exc)
            return
        self.policy.level = int(level)

    @property
    def level(self) -> int:
        return int(self.policy.level)

    # ---- our records ----

    def record(self) -> MemberRecord:
        # writers' levels steer readers (sampling.LevelPolicy)
        return own_member_record(self.dht.peer_id, self.info, self.round, self.cfg.client_mode, self.level)

    def refresh_period(self, view_size: int = 0) -> float:
        """Seconds between stores of our record: fixed, whatever the swarm's size."""
        return self.cfg.record_ttl_s / STORES_PER_TTL

    def store_due(self, now: float, view_size: int, blobs: BlobStore) -> None:
        """Store what is due at monotonic time `now`: our record in its shard keys every refresh period, the
        parameters' announcement every time (DPO neighbours poll it). No batch record."""
        self.announce("params", blobs.entries("params"))
        if now < self._next_member_store:
            return
        keys = sampling.write_keys(self.cfg.swarm_id, self.dht.peer_id, self.level)
        value = self.record().model_dump()
        size = len(MSGPackSerializer.dumps(value)) + len(self.dht.subkey)
        expiration = time.time() + self.cfg.record_ttl_s
        stored = 0
        for key in keys:
            self.counters.add("control_bytes_out", len(key) + size)
            try:
                stored += quiet_store(self.dht.call, key, self.dht.subkey, value, expiration) > 0
            except Exception as exc:
                self.log.warning("storing our record in %s failed (will retry on the next heartbeat): %s", key, exc)
        self._written.update(keys)
        if stored:
            self._next_member_store = now + self.refresh_period() - 0.5

    def store_all_now(self) -> None:
        """Make our record due at once (after the DHT child was restarted)."""
        self._next_member_store = 0.0

    def announce(self, kind: str, entries: list[BlobEntry], ttl: float | None = None) -> None:
        if not entries:
            return
        value = {"peer_id": self.dht.peer_id, "updated": float(time.time()), "blobs": [e.model_dump() for e in entries]}
        key = blobs_key(self.cfg.swarm_id, kind)
        self.counters.add("control_bytes_out", len(key) + len(self.dht.subkey) + len(MSGPackSerializer.dumps(value)))
        try:
            self.dht.call("store", key, value, time.time() + (ttl or self.cfg.record_ttl_s), subkey=self.dht.subkey)
        except Exception as exc:
            self.log.warning("storing %s failed (will retry on the next heartbeat): %s", key, exc)

    def withdraw(self) -> None:
        """Overwrite our records with None so readers stop listing us before the TTL runs out."""
        expiration = time.time() + self.cfg.record_ttl_s
        for key in sorted(self._written):
            try:
                quiet_store(self.dht.call, key, self.dht.subkey, None, expiration)
            except Exception as exc:
                self.log.debug("withdrawing %s: %s", key, exc)
        for kind in KINDS:
            try:
                self.dht.call("store", blobs_key(self.cfg.swarm_id, kind), None, expiration, subkey=self.dht.subkey)
            except Exception as exc:
                self.log.debug("withdrawing %s: %s", kind, exc)

    # ---- others' records ----

    def read_due(self, now: float) -> bool:
        return now >= self._next_read

    def full_read_due(self, now: float) -> bool:
        """No read merges replicas' copies here (and none forgets peers: the view expires them)."""
        return False

    def read_done(self, now: float, view_size: int, full: bool = False) -> None:
        self._next_read = now + READ_EVERY_BEATS * self.cfg.heartbeat_s - 0.5

    def live_peers(self) -> list[MemberRecord]:
        """Members read lately with an unexpired record, self included (a sample, not the whole swarm)."""
        cutoff = time.time() - self.cfg.record_ttl_s
        members = {pid: m for pid, m in self._known.items() if m.updated >= cutoff}
        members[self.dht.peer_id] = self.record()
        return sorted(members.values(), key=lambda m: m.peer_id)

    def read_members(self, latest: bool = True, beam_size: int | None = None) -> dict[str, MemberRecord]:
        """The signed records of one random shard at our level (one replica's copy); then the level policy
        sees how many there were and at which levels their writers are. `latest`/`beam_size` are full
        membership's and ignored. A read that fails answers with the last that worked, for up to a TTL."""
        # our level, or now and then a probe deeper (LevelPolicy.read_level: a group drifted shallow finds the rest)
        read_level = self.policy.read_level(self.rng)
        key = sampling.random_read_key(self.cfg.swarm_id, read_level, self.rng)
        try:
            value, size = quiet_read(self.dht.call, key)
        except Exception as exc:
            self.log.debug("reading %s failed: %s", key, exc)
            value, size = None, 0
        now = time.monotonic()
        if value is None:
            when, last = self._members_read
            return dict(last) if now - when < self.cfg.record_ttl_s else {}
        self.counters.add("control_bytes_in", size)
        found, problems = parse_signed(value, MemberRecord)
        self.counters.reject_records(key, problems)
        others = [m for pid, m in found.items() if pid != self.dht.peer_id]
        levels = [int(m.level) for m in others]
        self.policy.observe(len(found), levels, read_level=read_level)
        for pid, m in found.items():
            self._known.pop(pid, None)
            self._known[pid] = m
        while len(self._known) > MAX_KNOWN:
            self._known.pop(next(iter(self._known)))
        self._members_read = (now, dict(found))
        return found

    def read_announcements(self, kind: str) -> dict[str, Announcement]:
        """Everyone's announcements of `kind` (DPO's parameters; plain DHT get, as full membership)."""
        key = blobs_key(self.cfg.swarm_id, kind)
        try:
            found = self.dht.call("get", key, latest=True)
        except Exception as exc:
            self.log.debug("reading %s failed: %s", key, exc)
            return {}
        records, problems = parse_signed(found.value if found is not None else None, Announcement)
        self.counters.reject_records(key, problems)
        return records
