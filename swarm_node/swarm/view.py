"""Whom a peer pushes its batch announcements to, and the pushes themselves.

The view is the peers we may push to: those in the member list and those that pushed to us (bounded by
MAX_VIEW, so a flood of fresh identities does not grow it). Each round's announcement goes to F =
`push_fanout` random accepted, reachable peers of it (with a rank: trusted peers first, one place kept for
strangers), drawn afresh every time, one push in flight per
peer with a timeout, so a stopped peer cannot pile them up; a failed push skips that peer for a
heartbeat. A newcomer gets our newest announcement at once.

With sampled membership (shards.py) the view is bounded (sampling.ViewBook, VIEW_SIZE peers): a peer leaves
it when its record is older than a TTL and no push went either way within a TTL, and targets are ranked
(sampling.pick_targets: established, then warming, plus one exploration slot).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from hivemind.p2p import P2P

from swarm_node.config import SwarmConfig
from swarm_node.swarm.announce import BatchAnnouncement, encode, push
from swarm_node.swarm.counters import SwarmCounters
from swarm_node.swarm.loop import LoopThread
from swarm_node.swarm.records import MemberRecord
from swarm_node.swarm.sampling import VIEW_SIZE, ViewBook, pick_targets

MAX_VIEW = 4096  # peers we may push to (membership + pushers); the intake keeps state for as many
PUSH_TIMEOUT_S = 5.0

Accept = Callable[[MemberRecord], bool]


def accepts(accept: Accept | None, member: MemberRecord) -> bool:
    """accept(member), where a filter that raises declines (None: everyone)."""
    if accept is None:
        return True
    try:
        return bool(accept(member))
    except Exception:
        return False


class PeerView:
    """The peers we may push to, and our pushes to them.

    Owns: the view (peer id -> the member record we last saw of it), the accept filter (default: our own
    mode), who was already greeted with our newest announcement, peers skipped as unreachable, one push in
    flight per peer, and `latest`, our newest batch announcement (re-pushed every heartbeat).
    May call: announce (encode, push) over the P2P replica that `p2p()` returns, the LoopThread,
    SwarmCounters. Not the intake or the DHT: the caller tells it who is a member.
    Thread: updates from the heartbeat thread (members) and the loop thread (pushers), under one lock;
    pushes run on the loop thread; `announce`, `repush` and `greet` may be called from any thread.
    """

    def __init__(self, cfg: SwarmConfig, my_mode: str, accept: Accept | None, p2p: Callable[[], P2P | None],
                 loop: LoopThread, counters: SwarmCounters, log: logging.Logger,
                 rank: Callable[[str], int] | None = None, sampled: bool = False) -> None:
        self.cfg = cfg
        self.my_mode = my_mode
        self.accept = accept
        self.rank = rank  # peer id -> 0 for a peer we trust (receiver.Rank); None: everyone alike
        self.peer_id = ""  # ours, once the DHT has started
        self.latest: BatchAnnouncement | None = None
        self._p2p = p2p
        self.loop = loop
        self.counters = counters
        self.log = log
        self._peers: dict[str, MemberRecord] = {}
        self._lock = threading.Lock()
        self._greeted: set[str] = set()
        self._pushing: set[str] = set()  # loop thread only
        self._unreachable: dict[str, float] = {}  # peer -> monotonic time until which we skip it (bounded)
        # peer -> when its pushes began to fail (none got through since); kept while a peer drops out of a
        # member list and back (a replica's copy may lack it), so only a push that gets through resets it
        self._failing_since: dict[str, float] = {}
        # sampled membership: the bounded view's book (who may stay), and the ranked target choice
        self.book = ViewBook(VIEW_SIZE, cfg.record_ttl_s) if sampled else None
        self._pick = pick_targets if sampled else None
        self._rng = random.Random()
        self.last_contact = float("-inf")  # monotonic time a push of ours last got through

    # ---- who is in it ----

    def accepts(self, member: MemberRecord) -> bool:
        """Do we push to and download from this peer? (by its mode, task, tokenizer...)"""
        if self.accept is None:
            return member.mode == self.my_mode
        return accepts(self.accept, member)

    def __contains__(self, peer_id: str) -> bool:
        with self._lock:
            return peer_id in self._peers

    def __len__(self) -> int:
        with self._lock:
            return len(self._peers)

    def others(self) -> list[MemberRecord]:
        with self._lock:
            return [m for pid, m in self._peers.items() if pid != self.peer_id]

    def count_accepted(self, accept: Accept | None = None) -> int:
        """Peers in the view we accept (and that `accept` accepts too)."""
        return sum(1 for m in self.others() if self.accepts(m) and accepts(accept, m))

    def update(self, members: dict[str, MemberRecord], heard: set[str], forget: bool = True) -> list[str]:
        """A member-list read: members join or refresh; if `forget` (a complete read), peers neither listed
        nor `heard` (pushed to us within a TTL) are forgotten. Returns the forgotten ids."""
        if self.book is not None:
            return self._book_update(members)
        with self._lock:
            for pid, m in members.items():
                if pid != self.peer_id:
                    self._peers[pid] = m
            gone = [pid for pid in self._peers if pid not in members and pid not in heard] if forget else []
            for pid in gone:
                del self._peers[pid]
                self._greeted.discard(pid)
                self._unreachable.pop(pid, None)
            now = time.monotonic()
            for pid in [p for p, until in self._unreachable.items() if until <= now]:
                del self._unreachable[pid]  # its heartbeat of skipping is over
        return gone

    def _book_update(self, members: dict[str, MemberRecord]) -> list[str]:
        """Sampled membership: records read join the bounded view (the book decides who stays); peers whose
        record expired without a push either way within a TTL leave. Returns the ids that left."""
        now = time.time()
        with self._lock:
            for pid, m in members.items():
                if pid != self.peer_id and self.book.add(pid, m, min(m.updated, now), now,
                                                                 rank=self._rank_of(pid)):
                    self._peers[pid] = m
            gone = set(self.book.expire(now)) | (set(self._peers) - set(self.book.peers()))
            for pid in gone:
                self._forget(pid)
        return sorted(gone)

    def _forget(self, pid: str) -> None:
        self._peers.pop(pid, None)
        self._greeted.discard(pid)
        self._unreachable.pop(pid, None)

    def unreachable_for(self, min_s: float) -> list[str]:
        """Peers in the view that every push has failed to reach for at least `min_s` seconds."""
        now = time.monotonic()
        with self._lock:
            return [pid for pid, t in self._failing_since.items() if now - t >= min_s and pid in self._peers]

    def heard_from(self, peer_id: str, member: MemberRecord) -> bool:
        """A peer pushed to us: it joins (or refreshes) the view while there is room. True if it is new."""
        with self._lock:
            if self.book is not None:
                first = peer_id not in self._peers
                now = time.time()
                if self.book.add(peer_id, member, min(member.updated, now), now, rank=self._rank_of(peer_id)):
                    self.book.touch(peer_id, now)
                    self._peers[peer_id] = member
                    for pid in set(self._peers) - set(self.book.peers()):
                        self._forget(pid)  # evicted to make room
                else:
                    first = False
                return first
            first = peer_id not in self._peers and len(self._peers) < MAX_VIEW
            if first or peer_id in self._peers:
                self._peers[peer_id] = member
        return first

    def targets(self, n: int, exclude: set[str] | None = None) -> list[str]:
        """A fresh random sample of n accepted, reachable peers (peer sampling over the view).

        With a `rank`, the peers ranked 0 (trusted) fill all but one of the n first and strangers the rest:
        anyone may push to us and so join the view, and without this, identities that only announce
        (tooling/stallers.py) took nearly all of our pushes, so an established peer heard of our
        batches only now and then; the stranger's place keeps newcomers hearing of them.
        """
        now = time.monotonic()
        with self._lock:
            pool = [pid for pid, m in self._peers.items() if pid != self.peer_id and self.accepts(m)
                    and self._unreachable.get(pid, 0.0) <= now and not (exclude and pid in exclude)]
        if self._pick is not None:
            return self._pick(pool, self._rank_of, n, self._rng)
        if self.rank is None:
            return random.sample(pool, min(n, len(pool)))
        known, strangers = [], []
        for pid in pool:
            (known if self._rank_of(pid) == 0 else strangers).append(pid)
        take = min(len(known), n - 1 if strangers and n > 1 else n)
        return random.sample(known, take) + random.sample(strangers, min(n - take, len(strangers)))

    def _rank_of(self, peer_id: str) -> int:
        if self.rank is None:
            return 2  # everyone alike: a stranger
        try:
            return int(self.rank(peer_id))
        except Exception:  # a rank hook that fails ranks the peer a stranger
            return 2

    # ---- pushes ----

    def announce(self, ann: BatchAnnouncement) -> None:
        """Our newest batch: remember it and push it to F random neighbours (any thread; returns at once)."""
        self.latest = ann
        self.loop.call_soon(self._push_to, self.targets(self.cfg.fanout()), ann)

    def repush(self) -> None:
        """Our newest announcement again, to F random neighbours (repairs a push lost to a restart)."""
        ann = self.latest
        if ann is not None:
            self.loop.call_soon(self._push_to, self.targets(self.cfg.fanout()), ann)

    def greet(self, n_members: int) -> None:
        """After a member-list read: peers not greeted yet get our newest announcement, F others again."""
        ann = self.latest
        if ann is None:
            return
        fresh = [pid for pid in self.targets(n_members) if pid not in self._greeted]
        self._greeted.update(fresh)
        again = self.targets(self.cfg.fanout(), exclude=set(fresh))
        self.loop.call_soon(self._push_to, fresh + again, ann)

    def greet_newcomer(self, peer_id: str) -> None:
        """On the loop thread: a peer new to the view pushed to us; it learns of our newest batch at once."""
        ann = self.latest
        if ann is not None and peer_id not in self._greeted:
            self._greeted.add(peer_id)
            self._push_to([peer_id], ann)

    def _push_to(self, targets: list[str], ann: BatchAnnouncement) -> None:
        """On the loop thread: start one push per target (skipping peers with a push still in flight)."""
        frame = encode(ann)
        for pid in targets:
            if pid in self._pushing:
                continue
            self._pushing.add(pid)
            self.loop.spawn(self._push_one(pid, frame))

    async def _push_one(self, pid: str, frame: bytes) -> None:
        try:
            p2p = self._p2p()
            if p2p is None:
                raise ConnectionError("P2P is restarting")
            await push(p2p, pid, frame, PUSH_TIMEOUT_S)
            self.counters.add("control_bytes_out", len(frame))
            self.counters.add("announcements_out")
            with self._lock:
                self._failing_since.pop(pid, None)
                self.last_contact = time.monotonic()
                if self.book is not None:
                    self.book.touch(pid, time.time())
        except Exception as exc:  # dial failures, timeouts (a stopped peer), closed streams
            self.counters.add("push_failed")
            with self._lock:
                self._unreachable.pop(pid, None)  # re-inserted last: the dict's order is the order of failures
                self._unreachable[pid] = time.monotonic() + self.cfg.heartbeat_s
                while len(self._unreachable) > MAX_VIEW:  # bounded: the oldest skip ends early
                    self._unreachable.pop(next(iter(self._unreachable)))
                self._failing_since.setdefault(pid, time.monotonic())
                while len(self._failing_since) > 2 * MAX_VIEW:  # bounded: the oldest entries go first
                    self._failing_since.pop(next(iter(self._failing_since)))
            self.log.debug("pushing an announcement to %s failed: %s", pid, exc)
        finally:
            self._pushing.discard(pid)
