"""The receive side of the asynchronous exchange: freshness rules and the bounded intake buffer.

Pure bookkeeping (no networking, no threads of its own): the event loop thread offers announcements and
puts downloaded payloads (already decoded and validated off the round loop, when the node gave a
validator); the round loop takes up to K batches. Everything is bounded: one buffered batch
and one pending announcement per peer, a total batch and byte budget (oldest evicted first, counted), and
per-peer replay state of one integer, for at most `max_peers` peers (least recently heard dropped first).

Freshness is measured at the sender: an announcement carries the sender's policy version and the unix
time it generated the batch. The receiver never compares round counters of different nodes (they drift
apart as soon as speeds differ); it compares a batch with *its sender's own* newest version, and its
generation time with its own clock (allowing a small skew).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from swarm_node.swarm import reasons


@dataclass(frozen=True)
class Freshness:
    """Limits on what a receiver keeps; see docs/protocol.md ("Freshness") for the defaults and why."""

    max_age_s: float = 120.0
    max_version_lag: int = 32
    max_clock_skew_s: float = 5.0
    max_version_jump: int = 1000


@dataclass(frozen=True)
class Offer:
    """An announced batch: who has it, which of their rounds and policy versions, when it was generated."""

    peer_id: str
    round: int
    version: int
    generated: float
    size: int
    sha256: str
    info: dict = field(default_factory=dict, compare=False)


@dataclass
class Buffered:
    offer: Offer
    payload: bytes
    arrived: float
    decoded: Any = None  # what the node's validator made of the payload off the round loop (None: no validator)


@dataclass
class _Peer:
    newest_round: int = -1  # newest round offered and accepted (buffered, pending or consumed): replay bound
    newest_version: int = -1  # the sender's newest policy version we have heard of
    known_round: int = -1  # round in its last signed membership record (-1: none read yet)
    pending: Offer | None = None  # newest offer not (yet) downloaded
    fetching: Offer | None = None
    slot: Buffered | None = None
    heard: float = 0.0


def check_offer(offer: Offer, peer: _Peer | None, limits: Freshness, now: float) -> str | None:
    """Why an offer is refused (a counter name), or None. `peer` is what we know of its sender."""
    if not (math.isfinite(offer.generated) and offer.generated > 0):
        return reasons.BAD_TIME
    if offer.generated > now + limits.max_clock_skew_s:
        return reasons.FUTURE_TIME
    if offer.version > offer.round:  # a round's batch comes from a policy of at most that many updates
        return reasons.BAD_VERSION
    known = max(peer.known_round, peer.newest_round) if peer is not None else -1
    if offer.round > max(known, 0) + limits.max_version_jump:
        return reasons.FUTURE_ROUND
    if now - offer.generated > limits.max_age_s:
        return reasons.STALE_AGE
    return None


def lag_of(offer: Offer, peer: _Peer) -> int:
    return max(peer.newest_version - offer.version, 0)


class Intake:
    """Bounded buffer of peers' batches with the freshness rules; thread-safe."""

    def __init__(self, limits: Freshness, *, max_batches: int, max_bytes: int, max_peers: int = 4096,
                 max_size: int | None = None, clock=time.time, rng: random.Random | None = None):
        self.limits = limits
        self.max_size = max_bytes if max_size is None else max_size
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.max_peers = max_peers
        self.clock = clock
        self.rng = rng or random.Random()
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        self._bytes = 0
        self._batches = 0
        self.counts: Counter = Counter()  # rejected-by-reason and events (evicted, superseded, duplicate...)
        self.cond = threading.Condition()

    # ---- what the network side calls ----

    def note_member(self, peer_id: str, round_: int) -> None:
        """A signed membership record says this peer is at `round_` (bounds what it may claim)."""
        with self.cond:
            p = self._peer(peer_id)
            p.known_round = max(p.known_round, int(round_))

    def offer(self, offer: Offer) -> tuple[str, Offer | None]:
        """Register an announcement -> (verdict, offer to download now or None).

        verdict: "fetch", "pending" (kept as the peer's newest, downloaded when its slot frees),
        "duplicate" (already seen), or a refusal reason (counted).
        """
        now = self.clock()
        with self.cond:
            p = self._peers.get(offer.peer_id)
            reason = check_offer(offer, p, self.limits, now)
            if reason is not None:
                self.counts[reason] += 1
                return reason, None
            p = self._peer(offer.peer_id)
            p.heard = now
            p.newest_version = max(p.newest_version, offer.version)
            if offer.round <= p.newest_round:
                self.counts[reasons.DUPLICATE] += 1
                return reasons.DUPLICATE, None
            p.newest_round = offer.round
            if offer.size > self.max_size:
                self.counts[reasons.TOO_LARGE] += 1  # refused before any stream is opened
                return reasons.TOO_LARGE, None
            if p.slot is not None and lag_of(p.slot.offer, p) > self.limits.max_version_lag:
                self._drop_slot(p, reasons.SUPERSEDED)  # what we hold is too old next to what is on offer
            if p.slot is None and p.fetching is None:
                p.fetching, p.pending = offer, None
                return "fetch", offer
            p.pending = offer
            return "pending", None

    def fetched(self, offer: Offer, payload: bytes | None, decoded: Any = None) -> Offer | None:
        """A download finished (payload None: it failed, or its payload was refused by the validator), with
        the validated, decoded batch. Returns the next offer of that peer to fetch."""
        with self.cond:
            p = self._peers.get(offer.peer_id)
            if p is None:
                return None
            if p.fetching is offer:
                p.fetching = None
            if payload is not None:
                if p.slot is not None:
                    self._drop_slot(p, reasons.SUPERSEDED)
                p.slot = Buffered(offer, payload, self.clock(), decoded)
                self._bytes += len(payload)
                self._batches += 1
                self._enforce_bounds()
                self.cond.notify_all()
            return self._next_fetch(p)

    # ---- what the round loop calls ----

    def take(self, k: int, accept=None, *, min_round: int | None = None,
             choose=None) -> tuple[list[Buffered], list[Offer]]:
        """Up to k fresh batches of distinct peers, chosen at random; (taken, offers to fetch now).

        `choose(offers, k)`: when given, picks the indices to take instead (e.g. NewcomerGate.choose).

        Batches that have gone stale are dropped (counted `stale_age` / `stale_version`); ones the
        `accept` filter declines stay buffered (counted `declined`). `min_round` (lockstep) skips, but
        keeps, batches of earlier rounds.
        """
        now = self.clock()
        with self.cond:
            refetch = self._expire(now)
            ready = [p for p in self._peers.values() if p.slot is not None
                     and (min_round is None or p.slot.offer.round >= min_round)]
            if accept is not None:
                ok = []
                for p in ready:
                    if accept(p.slot.offer):
                        ok.append(p)
                    else:
                        self.counts[reasons.DECLINED] += 1
                ready = ok
            chosen = self.rng.sample(ready, min(k, len(ready))) if k > 0 else []
            if choose is not None and k > 0:
                chosen = [ready[i] for i in choose([p.slot.offer for p in ready], k)][:k]
            taken = []
            for p in chosen:
                taken.append(p.slot)
                self._release(p)
                nxt = self._next_fetch(p)
                if nxt is not None:
                    refetch.append(nxt)
            return taken, refetch

    def count_ready(self, accept=None, *, min_round: int | None = None) -> int:
        with self.cond:
            return sum(1 for p in self._peers.values() if p.slot is not None
                       and (min_round is None or p.slot.offer.round >= min_round)
                       and (accept is None or accept(p.slot.offer)))

    def ages(self, batches: list[Buffered]) -> list[tuple[float, int]]:
        """(age in seconds, version lag behind its sender's newest) of batches just taken."""
        now = self.clock()
        with self.cond:
            return [(now - b.offer.generated, lag_of(b.offer, self._peers.get(b.offer.peer_id) or _Peer()))
                    for b in batches]

    def version_of(self, peer_id: str) -> int:
        with self.cond:
            p = self._peers.get(peer_id)
            return p.newest_version if p else -1

    def newest_rounds(self) -> dict[str, int]:
        """Each peer's newest round offered and accepted (the replay bound), by peer id."""
        with self.cond:
            return {pid: p.newest_round for pid, p in self._peers.items()}

    def forget(self, peer_ids) -> None:
        """Peers gone from membership and silent: drop their state (bounds memory)."""
        with self.cond:
            for pid in list(peer_ids):
                p = self._peers.pop(pid, None)
                if p is not None and p.slot is not None:
                    self._bytes -= len(p.slot.payload)
                    self._batches -= 1

    def snapshot(self) -> dict:
        with self.cond:
            return {"buffered_batches": self._batches, "buffered_bytes": self._bytes, "peers": len(self._peers)}

    def heard_since(self, t: float) -> set[str]:
        with self.cond:
            return {pid for pid, p in self._peers.items() if p.heard >= t}

    # ---- internals (caller holds the lock) ----

    def _peer(self, peer_id: str) -> _Peer:
        p = self._peers.get(peer_id)
        if p is None:
            p = self._peers[peer_id] = _Peer()
            while len(self._peers) > self.max_peers:
                _pid, old = self._peers.popitem(last=False)
                if old.slot is not None:
                    self._bytes -= len(old.slot.payload)
                    self._batches -= 1
                    self.counts[reasons.EVICTED] += 1
        else:
            self._peers.move_to_end(peer_id)
        return p

    def _release(self, p: _Peer) -> None:
        self._bytes -= len(p.slot.payload)
        self._batches -= 1
        p.slot = None

    def _drop_slot(self, p: _Peer, why: str) -> None:
        self._release(p)
        self.counts[why] += 1

    def _next_fetch(self, p: _Peer) -> Offer | None:
        if p.slot is not None or p.fetching is not None or p.pending is None:
            return None
        if self.clock() - p.pending.generated > self.limits.max_age_s:
            p.pending = None  # went stale while we waited
            self.counts[reasons.STALE_AGE] += 1
            return None
        p.fetching, p.pending = p.pending, None
        return p.fetching

    def _expire(self, now: float) -> list[Offer]:
        """Drop stale buffered batches; returns the offers to fetch in their place."""
        refetch = []
        for p in self._peers.values():
            if p.slot is None:
                continue
            if now - p.slot.offer.generated > self.limits.max_age_s:
                self._drop_slot(p, reasons.STALE_AGE)
            elif lag_of(p.slot.offer, p) > self.limits.max_version_lag:
                self._drop_slot(p, reasons.STALE_VERSION)
            else:
                continue
            nxt = self._next_fetch(p)
            if nxt is not None:
                refetch.append(nxt)
        return refetch

    def _enforce_bounds(self) -> None:
        while self._batches > self.max_batches or self._bytes > self.max_bytes:
            oldest = min((p for p in self._peers.values() if p.slot is not None),
                         key=lambda p: p.slot.arrived, default=None)
            if oldest is None:
                break
            self._drop_slot(oldest, reasons.EVICTED)
