"""SwarmNode: membership heartbeats, pushed batch announcements, background downloads, on a supervised DHT.

Rollout batches move asynchronously (docs/architecture.md, "The exchange"): `publish` pushes a small
announcement to F random neighbours; a receiver downloads announced batches in the background into a
bounded intake buffer (`swarm/intake.py`), and each round `receive` takes what has arrived, without
waiting (or, in lockstep mode, waiting up to a deadline). DPO parameters keep the DHT-announced,
per-round `fetch`.

Threads: the caller's thread (publish/receive/fetch), one uvloop event-loop thread (P2P streams: serving,
announcements in and out, downloads), one heartbeat thread (membership read and write, re-announcements,
and restarting the DHT child if it dies). Calls into the DHT child go through one lock so its pipe is
written by one thread at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvloop
from hivemind.utils.serializer import MSGPackSerializer

from swarm_node.config import SwarmConfig
from swarm_node.swarm import announce as A
from swarm_node.swarm import records as R
from swarm_node.swarm.dht import RefusalTally, ensure_identity, kill_dht, start_dht, wait_dht_result
from swarm_node.swarm.intake import Freshness, Intake, Offer
from swarm_node.swarm.ratelimit import RateLimitedLog
from swarm_node.swarm.transfer import HANDLER, TransferError, download, make_handler, with_deadline

POLL_S = 0.5
FETCH_ATTEMPTS = 3  # a dropped stream is retried within the deadline (each failure is still counted)
RETRIABLE = frozenset({"stream_error"})  # refusals worth another try; a bad digest or size is not
DHT_CALL_TIMEOUT_S = 10.0


@dataclass
class PeerInfo:
    """What this node tells the swarm about itself (so peers can decline what they cannot use)."""

    mode: str
    model_name: str
    tokenizer_fp: str
    task_id: str
    arch_fp: str = ""


@dataclass
class Received:
    peer_id: str
    round: int
    payload: bytes
    member: R.MemberRecord | None
    version: int = -1  # sender's policy version that generated the batch (-1: not announced)
    age_s: float = 0.0  # receiver's clock minus the sender's generation time, when taken
    version_lag: int = 0  # sender's newest announced version minus this batch's
    arrived: float = 0.0  # unix time its download completed (arrived - generated: announcement to receipt)
    decoded: Any = None  # the validator's result, computed off the round loop (None: no validator set)


Validator = Callable[[bytes, int], "tuple[Any, str | None, str]"]
"""Decodes and checks a downloaded batch on the swarm's decode thread, not the round loop:
(payload, announced round) -> (decoded, None, "") to buffer it, or (None, reason, detail) to refuse it.
`reason` is a fixed name of the caller's code (counted as is, in `RoundIntake.payload_refused`)."""


REFUSALS = ("too_large", "bad_time", "future_time", "bad_version", "future_round", "stale_age", "stale_version")
"""Intake verdicts that are refusals of a peer's batch (counted under `rejected`)."""
EVENTS = ("evicted", "superseded", "duplicate", "declined")
"""Intake events that are not a peer's fault (counted on their own)."""
MAX_DOWNLOADS = 4
VIEW_READ_PEERS = 8  # membership is read every heartbeat up to this many peers, proportionally less often beyond
MAX_VIEW = 4096  # peers we may push to (membership + pushers); the intake keeps state for as many
PUSH_TIMEOUT_S = 5.0
STORE_BEAM = 4
"""Beam width of the Kademlia lookup before a store (hivemind's default is the bucket size, 20). Every
node that lookup visits and that holds the key answers with the whole value: for the membership key,
one record per peer, so below 20 peers a store cost O(swarm^2) bytes. A beam just above DHT_REPLICAS
still finds the replicas' nodes and visits a bounded number of holders."""
MEMBER_REFRESHES_PER_TTL = 3  # the membership record is re-stored 3 times per TTL (lives through 2 misses)


@dataclass
class RoundIntake:
    """What one round received, and what the exchange cost since the previous round."""

    batches: list[Received]
    waited_s: float  # time the round spent waiting for peers (0 in async mode)
    rejected: dict  # refusals by reason since the previous round (transport and freshness)
    events: dict  # evictions, superseded, duplicates, declines since the previous round
    payload_bytes_in: int
    payload_bytes_out: int
    control_bytes_in: int
    control_bytes_out: int
    payload_refused: dict = field(default_factory=dict)  # refused by the validator, by its reason, since last round


class DHTUnavailable(RuntimeError):
    """The DHT child is down (being restarted)."""


class SwarmNode:
    """One peer of a swarm; see docs/operations.md for keys, TTLs and limits."""

    def __init__(self, cfg: SwarmConfig, info: PeerInfo, *, logger: logging.Logger | None = None):
        self.cfg = cfg
        self.info = info
        self.log = logger or logging.getLogger("swarm_node.swarm")
        self._peer_log = RateLimitedLog(self.log)  # lines a peer can cause: rate-limited per reason
        self._refusals = RefusalTally()  # records our DHT child refused (records.RecordGuard, bound_storage)
        self.peer_id = ""
        self._round = 0
        self._keep = min(max(8, cfg.staleness_rounds + 1), R.MAX_ANNOUNCED_ROUNDS)
        self._blobs: dict[str, OrderedDict[int, tuple[bytes, R.BlobEntry]]] = {k: OrderedDict() for k in R.KINDS}
        self._blob_lock = threading.Lock()
        self._counts = {"bytes_in": 0, "bytes_out": 0, "received": 0, "served": 0, "declined": 0, "dht_restarts": 0,
                        "control_bytes_in": 0, "control_bytes_out": 0, "announcements_in": 0,
                        "announcements_out": 0, "push_failed": 0}
        self.intake = Intake(
            Freshness(cfg.max_batch_age_s, cfg.max_version_lag, cfg.max_clock_skew_s, cfg.max_version_jump),
            max_batches=cfg.buffer_batches, max_bytes=cfg.buffer_bytes, max_size=cfg.max_batch_bytes,
        )
        self._accept: Callable[[R.MemberRecord], bool] | None = None
        self._validate: Validator | None = None
        self._decoder: concurrent.futures.ThreadPoolExecutor | None = None  # one thread: decodes one at a time
        self._payload_refused: Counter = Counter()
        self._view: dict[str, R.MemberRecord] = {}  # peers we may push to: membership + who pushed to us
        self._view_lock = threading.Lock()
        self._greeted: set[str] = set()  # peers that already got our latest announcement once
        self._pushing: set[str] = set()  # one push in flight per peer (a stopped peer cannot pile them up)
        self._unreachable: dict[str, float] = {}  # peer -> monotonic time until which we skip it
        self._latest_ann: A.BatchAnnouncement | None = None
        self._tasks: set = set()
        self._downloads: asyncio.Semaphore | None = None
        self._last_round_stats: dict | None = None
        self._next_view_read = 0.0
        self._next_member_store = 0.0  # monotonic times the membership / batch DHT records are due
        self._next_batch_store = 0.0
        self._rejected: dict[str, int] = {}
        self._warned: set[tuple] = set()
        self._stat_lock = threading.Lock()
        self._dht = None
        self._p2p = None
        self._dht_lock = threading.RLock()
        self._stop = threading.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._tmp_identity = None

    # ---- lifecycle ----

    def start(self) -> SwarmNode:
        """Join (retrying; UserFacingError if unreachable), serve blobs, start heartbeats. Once per node."""
        if self._loop is not None or self._closed:
            raise RuntimeError("SwarmNode.start() called twice (a node starts once; `with node:` starts it)")
        self._identity, self._tmp_identity, created = ensure_identity(self.cfg.identity_path)
        key = R.load_identity_key(self._identity)
        self._subkey = R.subkey_for(key)
        self.peer_id = R.peer_id_of_subkey(self._subkey) or ""
        self._validators = R.make_validators(self.cfg.swarm_id, key)
        self._loop = uvloop.new_event_loop()
        loop_thread = threading.Thread(target=self._loop.run_forever, name="swarm-node-loop", daemon=True)
        loop_thread.start()
        self._threads.append(loop_thread)
        t0 = time.monotonic()
        try:
            self._dht = start_dht(self.cfg, self._identity, self._validators, check_identity=not created, logger=self.log)
            self._attach_p2p()
        except BaseException:
            self.close()
            raise
        self.log.info("joined swarm %r as %s in %.1fs", self.cfg.swarm_id, self.peer_id, time.monotonic() - t0)
        self._heartbeat()
        hb = threading.Thread(target=self._heartbeat_loop, name="swarm-node-heartbeat", daemon=True)
        hb.start()
        self._threads.append(hb)
        return self

    def close(self) -> None:
        """Leave cleanly: withdraw our records, stop serving, stop the DHT child. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for t in self._threads:
            if t.name == "swarm-node-heartbeat" and t is not threading.current_thread():
                t.join(10)
        if self._dht is not None and self._dht.is_alive():
            self._withdraw()
        self._detach_p2p()
        if self._dht is not None:
            kill_dht(self._dht)
            self._dht = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            for t in self._threads:
                if t.name == "swarm-node-loop":
                    t.join(5)
        if self._decoder is not None:
            self._decoder.shutdown(wait=False, cancel_futures=True)
        if self._tmp_identity is not None:
            self._tmp_identity.cleanup()
            self._tmp_identity = None

    def __enter__(self) -> SwarmNode:
        return self if self._loop is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def visible_maddrs(self) -> list[str]:
        with self._dht_lock:
            return [str(m) for m in self._require_dht().get_visible_maddrs()]

    def set_round(self, r: int) -> None:
        self._round = int(r)

    def stats(self) -> dict:
        """Cumulative counters (tools read these); `round_stats`/`receive` give per-round deltas."""
        counts = dict(self.intake.counts)
        with self._stat_lock:
            rejected = dict(self._rejected)
            out = {**self._counts}
        for reason in REFUSALS:
            if counts.get(reason):
                rejected[reason] = rejected.get(reason, 0) + counts[reason]
        out["declined"] += counts.get("declined", 0)
        for ev in ("evicted", "superseded", "duplicate"):
            out[ev] = counts.get(ev, 0)
        with self._stat_lock:
            refused = dict(self._payload_refused)
        return {**out, "rejected": rejected, "payload_refused": refused, "buffer": self.intake.snapshot()}

    def set_validate(self, validate: Validator | None) -> None:
        """Decode and validate every downloaded batch in the background, before it is buffered (see Validator).

        The round then takes only batches that passed, and a payload that is slow to decode delays the
        decode thread, never the round. At most MAX_DOWNLOADS payloads are downloaded or decoded at once.
        """
        self._validate = validate
        if validate is not None and self._decoder is None:
            self._decoder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="swarm-node-decode")

    def set_accept(self, accept: Callable[[R.MemberRecord], bool] | None) -> None:
        """Which peers we push to and download from (by their mode, task, tokenizer...); None: same mode."""
        self._accept = accept

    def round_stats(self) -> dict:
        """Counters since the previous call: rejected and events by reason, payload and control bytes."""
        now = self.stats()
        before = self._last_round_stats or {"rejected": {}}
        self._last_round_stats = now
        rejected = {r: n - before["rejected"].get(r, 0) for r, n in now["rejected"].items()
                    if n > before["rejected"].get(r, 0)}
        was = before.get("payload_refused", {})
        refused = {r: n - was.get(r, 0) for r, n in now["payload_refused"].items() if n > was.get(r, 0)}
        keys = ("bytes_in", "bytes_out", "control_bytes_in", "control_bytes_out", *EVENTS)
        return {"rejected": rejected, "payload_refused": refused,
                **{k: now.get(k, 0) - before.get(k, 0) for k in keys}}

    # ---- membership ----

    def _member_record(self) -> dict:
        return R.MemberRecord(
            peer_id=self.peer_id, mode=self.info.mode, model_name=self.info.model_name,
            tokenizer_fp=self.info.tokenizer_fp, task_id=self.info.task_id, round=self._round,
            updated=float(time.time()), arch_fp=self.info.arch_fp, client_mode=self.cfg.client_mode,
        ).model_dump()

    def live_peers(self) -> list[R.MemberRecord]:
        """Members with an unexpired heartbeat, self included."""
        members = self._read_members()
        if self.peer_id not in members:
            members[self.peer_id] = R.MemberRecord.model_validate(self._member_record())
        return sorted(members.values(), key=lambda m: m.peer_id)

    def _read_members(self, latest: bool = True) -> dict[str, R.MemberRecord]:
        return self._read_signed(R.members_key(self.cfg.swarm_id), R.MemberRecord, latest=latest)

    def _read_announcements(self, kind: str) -> dict[str, R.Announcement]:
        return self._read_signed(R.blobs_key(self.cfg.swarm_id, kind), R.Announcement)

    def _read_signed(self, key: str, model, latest: bool = True) -> dict:
        """Entries under `key` whose record names the peer id of the key that signed it.

        latest=True asks every DHT node near the key (each answers with the whole dictionary: cost grows
        with the square of the swarm while it is below the bucket size); latest=False takes the first
        replica's copy (one answer), enough for peer sampling.
        """
        try:
            found = self._dht_call("get", key, latest=latest)
        except Exception as exc:
            self.log.debug("reading %s failed: %s", key, exc)
            return {}
        self._count_control_in(found.value if found is not None else None)
        records, problems = R.parse_signed(found.value if found is not None else None, model)
        for owner, detail, once in problems:
            self._reject("bad_record", owner, f"{key}: {detail}", once=(key, *once))
        return records

    # ---- blobs ----

    def publish(self, kind: str, round: int, payload: bytes, *, version: int | None = None,
                generated: float | None = None) -> None:
        """Keep `payload` for the last few rounds and announce it; never blocks on peers.

        A batch is announced by a push to F random neighbours (plus its DHT record at the next heartbeat);
        `version` is the policy version that generated it (default round - 1) and `generated` the unix
        time of generation (default now). Parameters (DPO) are announced in the DHT at once.
        """
        if kind not in R.KINDS:
            raise ValueError(f"unknown blob kind {kind!r}; expected one of {R.KINDS}")
        payload = bytes(payload)
        if len(payload) > self.cfg.max_batch_bytes:
            raise ValueError(f"{kind} payload of {len(payload)} bytes exceeds swarm.max_batch_bytes={self.cfg.max_batch_bytes}")
        entry = R.BlobEntry(round=int(round), size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
        with self._blob_lock:
            kept = self._blobs[kind]
            kept[entry.round] = (payload, entry)
            kept.move_to_end(entry.round)
            while len(kept) > self._keep:
                kept.popitem(last=False)
        if kind != "batch":
            self._announce(kind)
            return
        ann = A.BatchAnnouncement(
            kind="batch", round=entry.round, version=max(int(round) - 1, 0) if version is None else int(version),
            generated=float(time.time() if generated is None else generated), size=entry.size,
            sha256=entry.sha256, mode=self.info.mode, model_name=self.info.model_name,
            tokenizer_fp=self.info.tokenizer_fp, task_id=self.info.task_id,
        )
        self._latest_ann = ann
        if self._loop is not None and not self._closed:
            targets = self._push_targets(self.cfg.push_fanout)
            self._loop.call_soon_threadsafe(self._push_to, targets, ann)

    def _push_targets(self, n: int, exclude: set[str] | None = None) -> list[str]:
        """A fresh random sample of n accepted, reachable neighbours (peer sampling over our view)."""
        now = time.monotonic()
        with self._view_lock:
            pool = [pid for pid, m in self._view.items() if pid != self.peer_id and self._accepts_member(m)
                    and self._unreachable.get(pid, 0.0) <= now and not (exclude and pid in exclude)]
        return random.sample(pool, min(n, len(pool)))

    def _accepts_member(self, m: R.MemberRecord) -> bool:
        if self._accept is None:
            return m.mode == self.info.mode
        return self._accepts(self._accept, m)

    def _push_to(self, targets: list[str], ann: A.BatchAnnouncement) -> None:
        """On the loop thread: start one push per target (skipping peers with a push still in flight)."""
        frame = A.encode(ann)
        for pid in targets:
            if pid in self._pushing:
                continue
            self._pushing.add(pid)
            self._spawn(self._push_one(pid, frame))

    async def _push_one(self, pid: str, frame: bytes) -> None:
        try:
            p2p = self._p2p
            if p2p is None:
                raise ConnectionError("P2P is restarting")
            await A.push(p2p, pid, frame, PUSH_TIMEOUT_S)
            with self._stat_lock:
                self._counts["control_bytes_out"] += len(frame)
                self._counts["announcements_out"] += 1
        except Exception as exc:  # dial failures, timeouts (a stopped peer), closed streams
            with self._stat_lock:
                self._counts["push_failed"] += 1
            self._unreachable[pid] = time.monotonic() + self.cfg.heartbeat_s
            self.log.debug("pushing an announcement to %s failed: %s", pid, exc)
        finally:
            self._pushing.discard(pid)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_announcement(self, peer_id: str, ann: A.BatchAnnouncement | None, problem: str, nbytes: int) -> None:
        """On the loop thread: an authenticated peer announced a batch (or sent something invalid)."""
        with self._stat_lock:
            self._counts["control_bytes_in"] += nbytes
            self._counts["announcements_in"] += 1
        if ann is None:
            self._reject("bad_announcement", peer_id, problem, once=("bad_announcement", peer_id))
            return
        member = R.MemberRecord(peer_id=peer_id, mode=ann.mode, model_name=ann.model_name,
                                tokenizer_fp=ann.tokenizer_fp, task_id=ann.task_id, round=ann.round,
                                updated=float(time.time()))
        if not self._accepts_member(member):
            with self._stat_lock:
                self._counts["declined"] += 1
            return
        first = False
        with self._view_lock:
            if peer_id not in self._view:
                first = len(self._view) < MAX_VIEW  # a flood of fresh identities does not grow the view
            if first or peer_id in self._view:
                self._view[peer_id] = member
        offer = Offer(peer_id=peer_id, round=ann.round, version=ann.version, generated=ann.generated,
                      size=ann.size, sha256=ann.sha256, info={"member": member})
        verdict, to_fetch = self.intake.offer(offer)
        if verdict in REFUSALS:
            self._log_refusal(peer_id, verdict, f"batch round {ann.round} version {ann.version}, {ann.size} bytes")
        if to_fetch is not None:
            self._spawn(self._download_offer(to_fetch))
        if first and self._latest_ann is not None and peer_id not in self._greeted:
            self._greeted.add(peer_id)
            self._push_to([peer_id], self._latest_ann)  # a newcomer learns of our newest batch at once

    def _log_refusal(self, peer_id: str, reason: str, detail: str) -> None:
        self.log.warning("rejected from peer %s: %s (%s)", peer_id, reason, detail)

    async def _download_offer(self, offer: Offer) -> None:
        """Background download of an accepted offer, decoded and validated on the decode thread (when a
        validator is set), into the intake buffer; then the peer's next offer."""
        payload = decoded = None
        try:
            if self._downloads is None:
                self._downloads = asyncio.Semaphore(MAX_DOWNLOADS)
            async with self._downloads:  # bounds the payloads held while downloading or decoding
                entry = R.BlobEntry(round=offer.round, size=offer.size, sha256=offer.sha256)
                end = time.monotonic() + self.cfg.collect_deadline_s
                for _attempt in range(FETCH_ATTEMPTS):
                    payload, reason = await self._download("batch", offer.peer_id, entry, end - time.monotonic())
                    if payload is not None or reason not in RETRIABLE or time.monotonic() >= end:
                        break
                    await asyncio.sleep(0.2)
                validate, decoder = self._validate, self._decoder
                if payload is not None and validate is not None and decoder is not None and not self._closed:
                    decoded = await asyncio.get_running_loop().run_in_executor(
                        decoder, self._run_validator, validate, offer, payload)
                    if decoded is None:
                        payload = None  # refused (counted): the peer's slot frees for its next offer
        finally:
            nxt = self.intake.fetched(offer, payload, decoded)
            if nxt is not None and not self._closed:
                self._spawn(self._download_offer(nxt))

    def _run_validator(self, validate: Validator, offer: Offer, payload: bytes) -> Any:
        """On the decode thread: the decoded batch, or None after counting and logging the refusal."""
        try:
            decoded, reason, detail = validate(payload, offer.round)
        except Exception as exc:  # a validator must not raise; if it does, the batch is refused, not the node
            decoded, reason, detail = None, "validate_error", f"{type(exc).__name__}: {exc}"
        if reason is None and decoded is not None:
            return decoded
        reason = reason or "validate_error"
        with self._stat_lock:
            self._payload_refused[reason] += 1
        self._peer_log.warning(reason, "rejected batch round %d from %s: %s (%s)", offer.round, offer.peer_id,
                               reason, detail)
        return None

    def receive(self, k: int, *, accept: Callable[[R.MemberRecord], bool] | None = None,
                lockstep: bool = False, round: int = 0, staleness: int = 0,
                deadline_s: float = 0.0, choose: Callable[[list, int], list[int]] | None = None) -> RoundIntake:
        """Peers' batches for one round (at most one per peer, at most k), plus this round's exchange costs.

        Async (default): takes what has arrived, at once; nothing arrived -> no batches. Lockstep: waits up
        to `deadline_s` until min(k, accepted live peers) batches of rounds >= round - staleness are there.
        `choose(offers, k)`: which of the ready offers to take (default: k at random), e.g. a bounded
        share for identities not yet established (node.rollouts.NewcomerGate).
        """
        t0 = time.perf_counter()
        batches = (self._take(k, accept, lockstep, round, staleness, deadline_s, choose)
                   if k > 0 and not self._closed else [])
        waited = time.perf_counter() - t0
        st = self.round_stats()
        events = {e: st[e] for e in EVENTS if st.get(e)}
        return RoundIntake(batches, waited, st["rejected"], events, st["bytes_in"], st["bytes_out"],
                           st["control_bytes_in"], st["control_bytes_out"], st["payload_refused"])

    def collect(
        self, kind: str, round: int, *, k: int, staleness: int, deadline_s: float,
        accept: Callable[[R.MemberRecord], bool] | None = None,
    ) -> list[Received]:
        """Lockstep receive of batches: wait up to the deadline for k batches of rounds >= round - staleness."""
        if kind != "batch":
            raise ValueError("collect() moves rollout batches; parameters use fetch()")
        if k <= 0 or self._closed:
            return []
        return self._take(k, accept, True, int(round), staleness, deadline_s)

    def _take(self, k, accept, lockstep, round_, staleness, deadline_s, choose=None) -> list[Received]:
        def ok(offer: Offer) -> bool:
            return accept is None or self._accepts(accept, offer.info["member"])

        min_round = round_ - staleness if lockstep else None
        if lockstep:
            end = time.monotonic() + deadline_s
            self._refresh_view()  # lockstep waits for every live peer, so it needs today's membership
            with self.intake.cond:
                while not self._closed:
                    want = min(k, self._count_others(accept))  # nobody else live: nothing to wait for
                    if self.intake.count_ready(ok, min_round=min_round) >= want:
                        break
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self.intake.cond.wait(min(left, POLL_S))
        taken, refetch = self.intake.take(k, ok, min_round=min_round, choose=choose)
        for offer in refetch:
            self._run_soon(self._download_offer(offer))
        out = []
        for b, (age, lag) in zip(taken, self.intake.ages(taken), strict=True):
            o = b.offer
            out.append(Received(o.peer_id, o.round, b.payload, o.info.get("member"), o.version, age, lag, b.arrived,
                                b.decoded))
        return out

    def _count_others(self, accept) -> int:
        with self._view_lock:
            members = [m for pid, m in self._view.items() if pid != self.peer_id]
        return sum(1 for m in members if self._accepts_member(m) and (accept is None or self._accepts(accept, m)))

    def _run_soon(self, coro) -> None:
        if self._loop is not None and not self._closed:
            self._loop.call_soon_threadsafe(self._spawn, coro)
        else:
            coro.close()

    def fetch(self, kind: str, peer_id: str, round: int, deadline_s: float) -> bytes | None:
        """One peer's blob for one round, waiting until it is announced in the DHT (up to the deadline)."""
        if self._closed:
            return None
        try:
            return self._run(self._fetch(kind, peer_id, int(round), deadline_s), deadline_s + 10)
        except Exception as exc:
            self.log.warning("fetch(%s, %s, round %d) failed: %s", kind, peer_id, round, exc)
            return None

    @staticmethod
    def _accepts(accept, member: R.MemberRecord) -> bool:
        if accept is None:
            return True
        try:
            return bool(accept(member))
        except Exception:
            return False

    def _announce(self, kind: str, ttl: float | None = None) -> None:
        with self._blob_lock:
            entries = [e.model_dump() for _p, e in self._blobs[kind].values()]
        if not entries:
            return
        value = {"peer_id": self.peer_id, "updated": float(time.time()), "blobs": entries}
        self._store(R.blobs_key(self.cfg.swarm_id, kind), value, ttl=ttl)

    def _store(self, key: str, value, ttl: float | None = None) -> bool:
        with self._stat_lock:
            self._counts["control_bytes_out"] += len(key) + len(self._subkey) + len(MSGPackSerializer.dumps(value))
        try:
            ok = self._dht_call("store", key, value, time.time() + (ttl or self.cfg.record_ttl_s), subkey=self._subkey,
                                beam_size=STORE_BEAM)
        except Exception as exc:
            self.log.warning("storing %s failed (will retry on the next heartbeat): %s", key, exc)
            return False
        if not ok:
            self.log.debug("storing %s was not accepted by any DHT peer", key)
        return bool(ok)

    def _lookup(self, kind: str, round_: int) -> bytes | None:
        with self._blob_lock:
            item = self._blobs.get(kind, {}).get(round_)
        return item[0] if item else None

    async def _fetch(self, kind: str, peer_id: str, round_: int, deadline_s: float) -> bytes | None:
        loop = asyncio.get_running_loop()
        end = time.monotonic() + deadline_s
        attempts = 0
        while time.monotonic() < end:
            ann = (await loop.run_in_executor(None, self._read_announcements, kind)).get(peer_id)
            entry = ann.entry(round_) if ann else None
            if entry is not None:
                attempts += 1
                payload, reason = await self._download(kind, peer_id, entry, end - time.monotonic())
                if payload is not None or reason not in RETRIABLE or attempts >= FETCH_ATTEMPTS:
                    return payload
                await asyncio.sleep(min(0.2, max(end - time.monotonic(), 0.0)))  # a dropped stream: try again
                continue
            if ann is not None and ann.latest is not None and ann.latest.round > round_ and len(ann.blobs) >= self._keep:
                return None  # that round is no longer kept by the peer
            await asyncio.sleep(min(POLL_S, max(end - time.monotonic(), 0.0)))
        self._reject("timeout", peer_id, f"{kind} round {round_} not announced within {deadline_s:.1f}s")
        return None

    async def _download(self, kind: str, peer_id: str, entry: R.BlobEntry,
                        timeout: float) -> tuple[bytes | None, str | None]:
        """One download -> (payload, None), or (None, reason) after a counted, logged rejection."""
        if entry.size > self.cfg.max_batch_bytes:
            self._reject("too_large", peer_id, f"{kind} round {entry.round}: announced {entry.size} bytes > limit {self.cfg.max_batch_bytes}")
            return None, "too_large"
        p2p = self._p2p
        if p2p is None:
            self._reject("stream_error", peer_id, "P2P is restarting")
            return None, "stream_error"
        try:
            payload = await with_deadline(
                download(p2p, peer_id, kind, entry.round, expected_size=entry.size, expected_sha256=entry.sha256,
                         max_bytes=self.cfg.max_batch_bytes, on_received=self._count_in),
                timeout,
            )
        except TransferError as exc:
            self._reject(exc.reason, peer_id, f"{kind} round {entry.round}: {exc.detail}")
            return None, exc.reason
        with self._stat_lock:
            self._counts["received"] += 1
        return payload, None

    # ---- counters ----

    def _count_control_in(self, value) -> None:
        """Application-level size of a DHT read (subkeys + serialized values; RPC framing not included)."""
        n = 0
        if isinstance(value, dict):
            for subkey, item in value.items():
                raw = getattr(item, "value", None)
                n += (len(subkey) if isinstance(subkey, bytes) else 0) + len(MSGPackSerializer.dumps(raw))
        with self._stat_lock:
            self._counts["control_bytes_in"] += n

    def _count_in(self, n: int) -> None:
        with self._stat_lock:
            self._counts["bytes_in"] += n

    def _count_out(self, n: int) -> None:
        with self._stat_lock:
            self._counts["bytes_out"] += n
            self._counts["served"] += 1

    def _reject(self, reason: str, peer_id: str, detail: str, once: tuple | None = None) -> None:
        """Count and log a refusal; `once` dedupes the same bad record seen on every poll."""
        with self._stat_lock:
            if once is not None:
                if once in self._warned:
                    return
                if len(self._warned) > 10_000:
                    self._warned.clear()
                self._warned.add(once)
            self._rejected[reason] = self._rejected.get(reason, 0) + 1
        self._peer_log.warning(reason, "rejected from peer %s: %s (%s)", peer_id, reason, detail)

    # ---- DHT + P2P plumbing ----

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _require_dht(self):
        dht = self._dht
        if dht is None or not dht.is_alive():
            raise DHTUnavailable("the DHT is restarting")
        return dht

    def _dht_call(self, method: str, *args, **kwargs):
        with self._dht_lock:
            dht = self._require_dht()
            future = getattr(dht, method)(*args, return_future=True, **kwargs)
        return wait_dht_result(dht, future, DHT_CALL_TIMEOUT_S)  # ends early if the child dies

    def _attach_p2p(self) -> None:
        async def attach():
            p2p = await self._dht.replicate_p2p()
            # late-bound lookup, so a test may swap what is served after start
            await p2p.add_binary_stream_handler(HANDLER, make_handler(lambda k, r: self._lookup(k, r), self._count_out,
                                                                   self._reject, kinds=frozenset(R.KINDS)))
            await p2p.add_binary_stream_handler(A.HANDLER, A.make_handler(self._on_announcement))
            return p2p

        with self._dht_lock:
            self._p2p = self._run(attach(), DHT_CALL_TIMEOUT_S + 5)
            self._p2p_socket = str(self._p2p.daemon_listen_maddr).removeprefix("/unix")

    def _detach_p2p(self) -> None:
        p2p, self._p2p = self._p2p, None
        if p2p is not None and self._loop is not None and self._loop.is_running():
            try:
                self._run(p2p.shutdown(), 5)
            except Exception as exc:
                self.log.debug("closing the P2P replica: %s", exc)

    def _withdraw(self) -> None:
        """Overwrite our records with None so peers stop listing us before the TTL runs out."""
        keys = [R.members_key(self.cfg.swarm_id)] + [R.blobs_key(self.cfg.swarm_id, k) for k in R.KINDS]
        for key in keys:
            try:
                self._dht_call("store", key, None, time.time() + self.cfg.record_ttl_s, subkey=self._subkey)
            except Exception as exc:
                self.log.debug("withdrawing %s: %s", key, exc)

    def _heartbeat(self) -> None:
        """Write our membership and DHT announcements, read membership when due, re-push our newest batch.

        The membership read is the one cost that grows with the swarm (a record per peer), so it is read
        every heartbeat up to VIEW_READ_PEERS peers and proportionally less often beyond: its bytes per
        second stay flat, and newcomers are learnt sooner anyway from their pushes.
        """
        for reason, n in self._refusals.poll(self._dht_call).items():  # records our DHT child refused
            with self._stat_lock:
                self._rejected[reason] = self._rejected.get(reason, 0) + n
        now = time.monotonic()
        with self._view_lock:
            n = len(self._view)
        # One DHT key holds every peer's membership record, and each DHT node that a store's lookup visits
        # and that holds the key answers with all of it: a store costs O(N) bytes. So, like the read, it is
        # done proportionally less often beyond VIEW_READ_PEERS peers (and at least 3 times per TTL), with
        # an expiry of 3 periods: its bytes per second stay flat. Liveness between stores is seen in pushes.
        period = max(self.cfg.record_ttl_s / MEMBER_REFRESHES_PER_TTL, self.cfg.heartbeat_s * max(1.0, n / VIEW_READ_PEERS))
        ttl = max(self.cfg.record_ttl_s, MEMBER_REFRESHES_PER_TTL * period)
        if now >= self._next_member_store:
            if self._store(R.members_key(self.cfg.swarm_id), self._member_record(), ttl=ttl):
                self._next_member_store = now + period - 0.5
        self._announce("params")  # DPO neighbours poll it for the round they need (small rings: every beat)
        # the batch DHT record is for `status` and tools only (peers learn of batches by push); it is one
        # key with a subkey per peer as well, so it follows the same schedule
        if now >= self._next_batch_store:
            with self._blob_lock:
                has_batch = bool(self._blobs["batch"])
            if has_batch:
                self._announce("batch", ttl=ttl)
                self._next_batch_store = now + period - 0.5
        if now >= self._next_view_read:
            self._refresh_view(latest=False)
            with self._view_lock:
                n = len(self._view)
            self._next_view_read = now + self.cfg.heartbeat_s * max(1.0, n / VIEW_READ_PEERS) - 0.5
        else:
            self._repush()

    def _refresh_view(self, latest: bool = True) -> None:
        """Membership read: who we may push to, and what round each peer has signed.

        Newcomers get our newest announcement at once; F random neighbours get it again (repairs a push
        lost to a restart). Peers gone from membership and silent for a TTL are forgotten.
        """
        members = self._read_members(latest=latest)
        if not members and self._dht is None:
            return
        now = time.time()
        heard = self.intake.heard_since(now - self.cfg.record_ttl_s)
        with self._view_lock:
            for pid, m in members.items():
                if pid != self.peer_id:
                    self._view[pid] = m
            gone = [pid for pid in self._view if pid not in members and pid not in heard]
            for pid in gone:
                del self._view[pid]
                self._greeted.discard(pid)
        for pid, m in members.items():
            if pid != self.peer_id:
                self.intake.note_member(pid, m.round)
        self.intake.forget(gone)
        ann = self._latest_ann
        if ann is None or self._loop is None or self._closed:
            return
        fresh = [pid for pid in self._push_targets(len(members)) if pid not in self._greeted]
        self._greeted.update(fresh)
        again = self._push_targets(self.cfg.push_fanout, exclude=set(fresh))
        self._loop.call_soon_threadsafe(self._push_to, fresh + again, ann)

    def _repush(self) -> None:
        ann = self._latest_ann
        if ann is not None and self._loop is not None and not self._closed:
            self._loop.call_soon_threadsafe(self._push_to, self._push_targets(self.cfg.push_fanout), ann)

    def _heartbeat_loop(self) -> None:
        next_beat = time.monotonic() + self.cfg.heartbeat_s
        while not self._stop.wait(min(1.0, self.cfg.heartbeat_s)):
            dht = self._dht
            if dht is not None and not dht.is_alive():
                self._recover(dht)
                next_beat = 0.0
            if time.monotonic() >= next_beat:
                self._heartbeat()
                next_beat = time.monotonic() + self.cfg.heartbeat_s

    def _recover(self, dead) -> None:
        """The DHT child died: start a new one with the same identity, rejoin, re-register, re-announce."""
        t0 = time.monotonic()
        self.log.warning("DHT child (pid %s) died with exit code %s; restarting it", dead.pid, dead.exitcode)
        with self._dht_lock:
            self._dht = None
        self._detach_p2p()
        kill_dht(dead, getattr(self, "_p2p_socket", None))
        delay = 1.0
        while not self._stop.is_set():
            try:
                dht = start_dht(self.cfg, self._identity, self._validators, check_identity=False, logger=self.log)
                with self._dht_lock:
                    self._dht = dht
                self._attach_p2p()
                break
            except Exception as exc:
                self.log.error("restarting the DHT failed (retrying in %.0fs): %s", delay, exc)
                if self._dht is not None:
                    kill_dht(self._dht)
                    with self._dht_lock:
                        self._dht = None
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
        if self._stop.is_set():
            return
        with self._stat_lock:
            self._counts["dht_restarts"] += 1
        self._next_member_store = self._next_batch_store = 0.0  # the next heartbeat re-stores both at once
        self._heartbeat()
        self.log.warning("DHT restarted and swarm rejoined in %.1fs", time.monotonic() - t0)
