"""When a peer that its member reads show alone pings the peers it knows (`SwarmPeer`'s heartbeat asks).

A node whose link was down for a minute has dropped every peer from its DHT routing table (their RPCs
failed) and its peers have dropped it, and nothing else dials again: such a node took 34-37 s after its
link returned to exchange again, 6-10 s with the pings (benchmarks/network.py link_cut, docs/results/network.md).

In sampled membership a shard read lists only a few peers, so an empty one says little; there the
heartbeat reports `contact` instead: a read listed another peer, or a push got through either way. After
ALONE_READS beats without contact it asks for a ping, then once every beat while still without contact.

Owns: the count of member reads (full mode) or heartbeats (sampled mode) in a row that listed or reached no
peer, and when the next ping may be.
May call: nothing (pure; the peer does the ping). Thread: the heartbeat thread.
"""

from __future__ import annotations

ALONE_READS = 3  # member reads that list no other peer before we ping the peers we know
REJOIN_EVERY_S = 5.0  # and again this often while they still list no one


class RejoinPolicy:
    """After `after_reads` member reads in a row that list no peer but us: ping now, then every `every_s`
    seconds while alone; one read that lists a peer resets it."""

    def __init__(self, after_reads: int = ALONE_READS, every_s: float = REJOIN_EVERY_S) -> None:
        self.after_reads = after_reads
        self.every_s = every_s
        self.alone_reads = 0  # consecutive member reads that listed no peer but us
        self.quiet_beats = 0  # consecutive heartbeats without contact (sampled mode)
        self._beat_due = False
        self._next = 0.0

    def read(self, others_listed: bool) -> None:
        """A member read finished; `others_listed`: it listed at least one peer other than us."""
        self.alone_reads = 0 if others_listed else self.alone_reads + 1

    def contact(self, had_contact: bool) -> None:
        """A heartbeat ended (sampled mode); `had_contact`: a read listed another peer, or a push got through
        either way since the last one."""
        self.quiet_beats = 0 if had_contact else self.quiet_beats + 1
        self._beat_due = self.quiet_beats >= self.after_reads

    def due(self, now: float) -> bool:
        """Should we ping the peers we know now (monotonic seconds)? True starts the next wait. In sampled mode
        it is True once per heartbeat without contact, from the `after_reads`-th on."""
        if self._beat_due:
            self._beat_due = False
            self._next = now + self.every_s
            return True
        if self.alone_reads < self.after_reads or now < self._next:
            return False
        self._next = now + self.every_s
        return True
