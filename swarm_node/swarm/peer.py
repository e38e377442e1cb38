"""SwarmPeer: one peer of a swarm, wired from its parts (the only class the node side uses).

Rollout batches move asynchronously (docs/architecture.md, "The exchange"): `publish` pushes a small
announcement to F random neighbours; a receiver downloads announced batches in the background, validates
them off the round loop and buffers them, and each round `receive` takes what has arrived, without
waiting (or, in lockstep mode, waiting up to a deadline). DPO parameters keep the DHT-announced,
per-round `fetch`.

The parts, each with its own contract in its docstring:
    supervisor.DHTSupervisor   the DHT child: identity, calls into it, P2P replica, restarts
    membership.Membership      our signed records in the DHT and reading everyone's, on a schedule
    shards.ShardedMembership   or (swarm.membership: sampled) our record in a few shard keys, random shard reads
    view.PeerView              whom we push to, and the pushes
    receiver.BatchReceiver     announcements in, downloads, validation, the round's take; DPO's fetch
    blobs.BlobStore            what we serve
    counters.SwarmCounters     every counter, and the rate-limited log of lines a peer can cause
    loop.LoopThread            the event-loop thread the P2P side runs on

Threads: the caller's thread (publish/receive/fetch), the event-loop thread (P2P streams: serving,
announcements in and out, downloads), the decode thread (the validator), and the heartbeat thread
(membership writes and reads, re-announcements, and restarting the DHT child if it dies).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from swarm_node.config import SwarmConfig
from swarm_node.swarm import announce, reasons, transfer
from swarm_node.swarm.addresses import config_warnings, unreachable_warning
from swarm_node.swarm.blobs import BlobStore, describe
from swarm_node.swarm.counters import SwarmCounters
from swarm_node.swarm.intake import Intake
from swarm_node.swarm.loop import LoopThread
from swarm_node.swarm.membership import STORE_BEAM, Membership, PeerInfo
from swarm_node.swarm.ratelimit import RateLimitedLog
from swarm_node.swarm.receiver import BatchReceiver, Rank, RoundIntake, Validator
from swarm_node.swarm.records import KINDS, MAX_ANNOUNCED_ROUNDS, MemberRecord
from swarm_node.swarm.rejoin import RejoinPolicy
from swarm_node.swarm.shards import ShardedMembership, membership_kind
from swarm_node.swarm.supervisor import DHTSupervisor
from swarm_node.swarm.view import Accept, PeerView

JOIN_POLL_S = 1.0  # membership re-reads while a joining node's first round finds no live peer

HEARTBEAT_THREAD = "swarm-node-heartbeat"
UNREACHABLE_WARN_S = 30.0  # a peer every push failed to reach for this long (or 6 heartbeats) is warned about
UNREACHABLE_HINT_EVERY_S = 600.0  # at most one such line per 10 minutes


class SwarmPeer:
    """One peer of a swarm; see docs/operations.md for keys, TTLs and limits.

    Owns: its parts (above), the heartbeat thread, and the order things start and stop in.
    May call: its parts' public methods. Its parts are public attributes (`dht`, `membership`, `view`,
    `receiver`, `blobs`, `counters`, `loop`) for tools and tests that drive one part on purpose.
    Thread: `start`, `close` and the round's calls (publish, receive, fetch, stats) on one caller thread.

    `validate` is required: the node's decode-and-check of a peer's batch (receiver.Validator), run on
    the decode thread before a batch is buffered, so the round takes only validated batches; None for a
    peer that takes no batches (DPO: its announcements of batches are declined before any download).
    `accept` picks the peers we push to and download from (by their mode, task, tokenizer...); None:
    our own mode. `batch_cap`: the largest rollout batch we download (a GRPO node: the largest payload a
    batch within its receive limits can be, grpo/limits.py); None: `swarm.max_batch_bytes`. `params_cap`:
    the largest DPO parameter payload we fetch or publish (a DPO node: `dpo.max_payload_bytes`); None:
    `swarm.max_batch_bytes`. `rank(peer_id)`: 0 for a peer we trust (a GRPO node: an identity its
    newcomer gate has established), 1 for one warming up, 2 for a stranger (receiver.Rank). It orders the waits for download
    slots (strangers share at most half of them) and picks whom we push to (trusted peers first, one place
    kept for strangers); None: everyone alike.
    """

    def __init__(self, cfg: SwarmConfig, info: PeerInfo, *, validate: Validator | None, accept: Accept | None = None,
                 batch_cap: int | None = None, params_cap: int | None = None, rank: Rank | None = None,
                 logger: logging.Logger | None = None):
        self.cfg = cfg
        self.info = info
        self.log = logger or logging.getLogger("swarm_node.swarm")
        self.counters = SwarmCounters(self.log)
        self.loop = LoopThread()
        self.blobs = BlobStore(min(max(8, cfg.staleness_rounds + 1), MAX_ANNOUNCED_ROUNDS))
        handlers = {
            # late-bound lookup, so a test may swap what is served after start
            transfer.HANDLER: transfer.make_handler(lambda k, r: self.blobs.served(k, r), self._served,
                                                    self.counters.reject, kinds=frozenset(KINDS)),
            announce.HANDLER: announce.make_handler(lambda *a: self.receiver.on_announcement(*a)),
        }
        self.dht = DHTSupervisor(cfg, self.loop, handlers, self.log)
        self.membership_kind = membership_kind(cfg.membership, info.mode)
        self.sampled = self.membership_kind == "sampled"
        self.membership: Membership | ShardedMembership = (
            ShardedMembership(cfg, info, self.dht, self.counters, self.log) if self.sampled
            else Membership(cfg, info, self.dht, self.counters, self.log))
        self.view = PeerView(cfg, info.mode, accept, lambda: self.dht.p2p, self.loop, self.counters, self.log,
                             rank=rank, sampled=self.sampled)
        self.receiver = BatchReceiver(cfg, validate, view=self.view, membership=self.membership, dht=self.dht,
                                      loop=self.loop, counters=self.counters, keep=self.blobs.keep, log=self.log,
                                      batch_cap=batch_cap, params_cap=params_cap, rank=rank)
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._keep_view_until = 0.0  # after a DHT restart: member reads may add peers, not forget them
        self.rejoin_policy = RejoinPolicy()  # when a peer alone in its member reads pings the peers it knows
        self._last_beat = time.monotonic()  # sampled membership: contact since the last heartbeat
        self._listed_others = False  # sampled membership: a read since the last heartbeat listed another peer
        self._hints = RateLimitedLog(self.log, burst=1, period_s=UNREACHABLE_HINT_EVERY_S)

    @property
    def peer_id(self) -> str:
        return self.dht.peer_id

    @property
    def intake(self) -> Intake:
        """The buffer of validated peers' batches (receiver.BatchReceiver owns it)."""
        return self.receiver.intake

    # ---- lifecycle ----

    def start(self) -> SwarmPeer:
        """Join (retrying; UserFacingError if unreachable), serve blobs, start heartbeats. Once per node."""
        if self._started or self._closed:
            raise RuntimeError("SwarmPeer.start() called twice (a node starts once; `with node:` starts it)")
        self._started = True
        for line in config_warnings(self.cfg):
            self.log.warning("%s", line)
        self.loop.start()
        t0 = time.monotonic()
        try:
            self.dht.start()
        except BaseException:
            self.close()
            raise
        self.view.peer_id = self.dht.peer_id
        if self.sampled:
            self.membership.guess_level()
        self.log.info("joined swarm %r as %s in %.1fs", self.cfg.swarm_id, self.peer_id, time.monotonic() - t0)
        self._heartbeat()
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name=HEARTBEAT_THREAD, daemon=True)
        self._heartbeat_thread.start()
        return self

    def close(self) -> None:
        """Leave cleanly: withdraw our records, stop serving, stop the DHT child. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.loop.stop_accepting()
        hb = self._heartbeat_thread
        if hb is not None and hb is not threading.current_thread():
            hb.join(10)
        if self.dht.alive():
            self.membership.withdraw()
        self.dht.close()
        self.loop.stop()
        self.receiver.close()

    def __enter__(self) -> SwarmPeer:
        return self if self._started else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def visible_maddrs(self) -> list[str]:
        return self.dht.visible_maddrs()

    def set_round(self, r: int) -> None:
        self.membership.round = int(r)

    def wait_for_peers(self, others: int, timeout_s: float, stopped: Callable[[], bool] = lambda: False, *,
                       accept: Accept | None = None) -> int:
        """Block until `others` peers we accept (and `accept` accepts) are live, reading membership now and
        every JOIN_POLL_S, at most `timeout_s` -> how many are live. A swarm started together then begins its
        rounds together, however long each peer takes to load its model."""
        end = time.monotonic() + timeout_s
        self._refresh_view()
        while ((live := self.view.count_accepted(accept)) < others and (left := end - time.monotonic()) > 0
               and not stopped() and not self._closed):
            time.sleep(min(JOIN_POLL_S, left))
            self._refresh_view()
        return live

    def live_peers(self) -> list[MemberRecord]:
        """Members with an unexpired heartbeat, self included."""
        return self.membership.live_peers()

    # ---- the round's calls ----

    def publish(self, kind: str, round: int, payload: bytes, *, version: int | None = None,
                generated: float | None = None) -> None:
        """Keep `payload` for the last few rounds and announce it; never blocks on peers.

        A batch is announced by a push to F random neighbours (plus its DHT record at the next heartbeat);
        `version` is the policy version that generated it (default round - 1) and `generated` the unix
        time of generation (default now). Parameters (DPO) are announced in the DHT at once.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown blob kind {kind!r}; expected one of {KINDS}")
        payload = bytes(payload)
        cap, setting = ((self.receiver.params_cap, "dpo.max_payload_bytes") if kind == "params"
                        else (self.cfg.max_batch_bytes, "swarm.max_batch_bytes"))
        if len(payload) > cap:
            raise ValueError(f"{kind} payload of {len(payload)} bytes exceeds {setting}={cap}")
        entry = self.blobs.put(kind, describe(round, payload), payload)
        if kind != "batch":
            self.membership.announce(kind, self.blobs.entries(kind))
            return
        self.view.announce(announce.BatchAnnouncement(
            kind="batch", round=entry.round, version=max(int(round) - 1, 0) if version is None else int(version),
            generated=float(time.time() if generated is None else generated), size=entry.size,
            sha256=entry.sha256, mode=self.info.mode, model_name=self.info.model_name,
            tokenizer_fp=self.info.tokenizer_fp, task_id=self.info.task_id,
        ))

    def receive(self, k: int, *, accept: Accept | None = None, lockstep: bool = False, round: int = 0,
                staleness: int = 0, deadline_s: float = 0.0,
                choose: Callable[[list, int], list[int]] | None = None, joining: bool = False) -> RoundIntake:
        """Peers' validated batches for one round (at most one per peer, at most k), plus this round's
        exchange costs.

        Async (default): takes what has arrived, at once; nothing arrived -> no batches. Lockstep: reads
        membership once, then waits up to `deadline_s` until min(k, accepted live peers) batches of rounds
        >= round - staleness are there. `choose(offers, k)`: which of the ready offers to take (default:
        k at random), e.g. a bounded share for identities not yet established (the node's newcomer gate).
        `joining` (the first round of a node that joined through initial peers): while no accepted peer is
        live yet, membership is read again every JOIN_POLL_S, within the same deadline, so that a node
        faster to start than its peers still waits for their first batches instead of finding nobody.
        """
        t0 = time.perf_counter()
        batches = []
        if k > 0 and not self._closed:
            if joining and self.cfg.initial_peers:  # reads membership until someone is live (or the deadline)
                self.wait_for_peers(1, deadline_s, accept=accept)
            elif lockstep or joining:
                self._refresh_view()  # lockstep waits for every live peer, so it needs today's membership
            left = max(0.0, deadline_s - (time.perf_counter() - t0))
            batches = self.receiver.take(k, accept, lockstep=lockstep, round_=int(round), staleness=staleness,
                                         deadline_s=left, choose=choose, closed=lambda: self._closed)
        waited = time.perf_counter() - t0
        st = self.round_stats()
        events = {e: st[e] for e in reasons.EVENTS if st.get(e)}
        return RoundIntake(batches, waited, st["rejected"], events, st["bytes_in"], st["bytes_out"],
                           st["control_bytes_in"], st["control_bytes_out"], st["payload_refused"])

    def fetch(self, kind: str, peer_id: str, round: int, deadline_s: float) -> bytes | None:
        """One peer's blob for one round, waiting until it is announced in the DHT (up to the deadline)."""
        if self._closed:
            return None
        return self.receiver.fetch(kind, peer_id, round, deadline_s)

    def stats(self) -> dict:
        """Cumulative counters (tools read these); `round_stats`/`receive` give per-round deltas."""
        return self.counters.stats(self.intake)

    def round_stats(self) -> dict:
        """Counters since the previous call: rejected and events by reason, payload and control bytes."""
        return self.counters.since_last(self.intake)

    # ---- heartbeat ----

    def _served(self, n: int) -> None:
        self.counters.add("bytes_out", n)
        self.counters.add("served")

    def _heartbeat(self) -> None:
        """Store our records when due, read membership when due, else re-push our newest batch."""
        self.counters.add_rejected(self.dht.new_refusals())  # records our DHT child refused
        self.dht.remember_peers()
        stuck_s = max(UNREACHABLE_WARN_S, 6 * self.cfg.heartbeat_s)
        stuck = self.view.unreachable_for(stuck_s)
        if stuck:
            self._hints.warning("unreachable", "%s", unreachable_warning(self.cfg, stuck, stuck_s))
        now = time.monotonic()
        self.membership.store_due(now, len(self.view), self.blobs)
        if self.membership.read_due(now):
            full = self.membership.full_read_due(now)
            self._refresh_view(latest=full, beam_size=STORE_BEAM if full else None)
            self.membership.read_done(now, len(self.view), full=full)
            if not self.sampled:
                self._rejoin_if_alone(now)
        else:
            self.view.repush()
        if self.sampled:
            self._note_contact(now)
            self._rejoin_if_alone(now)

    def _note_contact(self, now: float) -> None:
        """Sampled membership: tell the rejoin policy whether this heartbeat had contact with the swarm (a read
        listed another peer, or a push got through either way since the last beat); reads alone come only
        every other beat and list a random shard, which may hold only us."""
        since = self._last_beat
        pushed = self.view.last_contact >= since
        heard = bool(self.intake.heard_since(time.time() - (now - since)))
        contact = self._listed_others or pushed or heard
        self.rejoin_policy.contact(contact)
        self._listed_others = False
        self._last_beat = now

    def _rejoin_if_alone(self, now: float) -> None:
        """Ping the peers we know (initial and last connected) when the rejoin policy says so (rejoin.py)."""
        if not self.rejoin_policy.due(now):
            return
        answered = self.dht.rejoin()
        if answered:
            self.counters.add("rejoins")
            if self.sampled:  # (tooling/net_scenarios.py looks for the line's end)
                self.log.info("no contact with a peer for %d heartbeats: %d known peer(s) answered a ping; "
                              "rejoining", self.rejoin_policy.quiet_beats, answered)
            else:
                self.log.info("no peer listed in %d member reads: %d known peer(s) answered a ping; rejoining",
                              self.rejoin_policy.alone_reads, answered)

    def _refresh_view(self, latest: bool = True, beam_size: int | None = None) -> None:
        """Membership read: who we may push to, and what round each peer has signed.

        Newcomers get our newest announcement at once; F random neighbours get it again (repairs a push
        lost to a restart). Peers gone from a `latest` read (the replicas' copies merged) and silent for a
        TTL are forgotten; one copy may lack peers that are still there (membership.py says why).
        """
        members = self.membership.read_members(latest=latest, beam_size=beam_size)
        if self.sampled:
            self._listed_others |= bool(set(members) - {self.peer_id})
        else:
            self.rejoin_policy.read(others_listed=bool(set(members) - {self.peer_id}))
        if not members and self.dht.child is None:
            return
        heard = self.intake.heard_since(time.time() - self.cfg.record_ttl_s)
        if time.monotonic() < self._keep_view_until:
            heard |= {m.peer_id for m in self.view.others()}
        gone = self.view.update(members, heard, forget=latest and not self.sampled)
        for pid, m in members.items():
            if pid != self.peer_id:
                self.intake.note_member(pid, m.round)
        self.intake.forget(gone)
        if not self._closed:
            self.view.greet(len(members))

    def _heartbeat_loop(self) -> None:
        next_beat = time.monotonic() + self.cfg.heartbeat_s
        while not self._stop.is_set():
            self.dht.wait_for_exit(min(1.0, self.cfg.heartbeat_s))  # returns at once when the DHT child dies
            if self._stop.is_set():
                break
            dead = self.dht.dead_child()
            if dead is not None:
                self._recover(dead)
                next_beat = 0.0
            if time.monotonic() >= next_beat:
                self._heartbeat()
                next_beat = time.monotonic() + self.cfg.heartbeat_s

    def _recover(self, dead) -> None:
        """The DHT child died: a new one with the same identity, then our records re-stored at once.

        For a record TTL the view keeps the peers it had: the new child's storage starts empty, and a node
        that no one's routing table leads back to at once (a swarm's first node has no initial peers) would
        otherwise read a member list of itself, forget its peers and push its batches to nobody
        (benchmarks/dht_recovery.py --killed first --publisher killed).
        """
        t0 = time.monotonic()
        if not self.dht.restart(dead, self._stop):
            return
        self.counters.add("dht_restarts")
        self._keep_view_until = time.monotonic() + self.cfg.record_ttl_s
        self.membership.store_all_now()
        self._heartbeat()
        self.log.warning("DHT restarted and swarm rejoined in %.1fs", time.monotonic() - t0)
