"""The transfer/intake side of a peer: announcements in, background downloads, validation, and the take.

An accepted announcement becomes an offer to the intake buffer (`swarm/intake.py`: freshness rules,
one batch and one pending announcement per peer); an offer to fetch is downloaded in the background over
the blob stream (length and digest checked), then decoded and checked by the node's validator on its own
decode thread, and only what passed is buffered. At most MAX_DOWNLOADS run at once (`swarm/slots.py`):
a slot that frees goes to the peer the node ranks best (`rank`: established peers before strangers, then
the fewest recent failed downloads), strangers hold at most STRANGER_SLOTS, and a download is cut off
when it gets no byte for `download_stall_s` or has not ended within that plus size / `download_min_rate`
(at most `collect_deadline_s`), so identities that announce and never deliver hold a slot for seconds
and never one an established peer needs. Each round takes up to K buffered batches without waiting (lockstep:
waiting up to a deadline). DPO's parameters use `fetch` instead: one peer's blob for one round, found
through its DHT announcement.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from swarm_node.config import SwarmConfig
from swarm_node.swarm import reasons
from swarm_node.swarm.announce import BatchAnnouncement
from swarm_node.swarm.counters import SwarmCounters
from swarm_node.swarm.intake import Freshness, Intake, Offer
from swarm_node.swarm.loop import LoopThread
from swarm_node.swarm.membership import Membership
from swarm_node.swarm.records import BlobEntry, MemberRecord
from swarm_node.swarm.slots import DownloadSlots
from swarm_node.swarm.supervisor import DHTSupervisor
from swarm_node.swarm.transfer import TransferError, download, with_deadline
from swarm_node.swarm.view import Accept, PeerView, accepts

POLL_S = 0.5
MAX_DOWNLOADS = 4
STRANGER_SLOTS = MAX_DOWNLOADS // 2  # slots peers ranked above 0 (not established) may hold at once
MAX_FAILURES_KEPT = 4096  # peers whose recent failed downloads are remembered (the least recent dropped)
FETCH_ATTEMPTS = 3  # a dropped stream is retried within the deadline (each failure is still counted)
RETRIABLE = frozenset({reasons.STREAM_ERROR})  # refusals worth another try; a bad digest or size is not
FETCH_RETRIABLE = frozenset({reasons.STREAM_ERROR, reasons.STALLED})
FETCH_RETRY_S = 6.0
"""How long DPO's fetch keeps retrying a peer it cannot reach or that stopped sending, from the first such
failure: about a DHT child's restart (~1-2 s: kill, a new p2pd on the same port, the handlers attached
again) with room, so a neighbour that restarts is fetched, while one that is gone costs a round this much."""
FETCH_RETRY_PAUSE_S = 0.5


class PayloadRefused(Exception):
    """Raised by a validator to refuse a downloaded payload; `reason` is a fixed name of the validator's
    code (counted as is, in `RoundIntake.payload_refused`), `detail` goes to the (rate-limited) log."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


Rank = Callable[[str], int]
"""peer id -> its rank for download slots: 0 for a peer the node trusts (an established identity), higher
for strangers (each served after every lower rank, and together holding at most STRANGER_SLOTS)."""


Validator = Callable[[bytes, Offer], Any]
"""Decodes and checks a downloaded batch on the decode thread, not the round loop: (payload, the offer
it was announced as) -> the validated object to buffer (`Received.decoded`), or raise PayloadRefused.
Anything else it raises, or a None result, is refused as `validate_error`."""


def keep_raw(payload: bytes, offer: Offer) -> bytes:
    """The validator of swarm-level tools and tests that move opaque bytes: the payload itself."""
    return payload


@dataclass
class Received:
    peer_id: str
    round: int
    payload: bytes
    member: MemberRecord | None
    version: int = -1  # sender's policy version that generated the batch (-1: not announced)
    age_s: float = 0.0  # receiver's clock minus the sender's generation time, when taken
    version_lag: int = 0  # sender's newest announced version minus this batch's
    arrived: float = 0.0  # unix time its download completed (arrived - generated: announcement to receipt)
    decoded: Any = None  # what the validator returned for it, computed off the round loop


@dataclass
class RoundIntake:
    """What one round received, and what the exchange cost since the previous round."""

    batches: list[Received]
    waited_s: float  # time the round spent waiting for peers (0 in async mode)
    rejected: dict  # refusals by reason since the previous round (reasons.REJECTED)
    events: dict  # evictions, superseded, duplicates, declines since the previous round
    payload_bytes_in: int
    payload_bytes_out: int
    control_bytes_in: int
    control_bytes_out: int
    payload_refused: dict = field(default_factory=dict)  # refused by the validator, by its reason, since last round


class BatchReceiver:
    """The transfer/intake side of one peer.

    Owns: the intake buffer (`intake`), the validator and its one decode thread, the download slots,
    turning pushed announcements into offers and downloads, the round's take (and lockstep's wait), and
    DPO's per-round `fetch`. With no validator (a DPO peer) it takes no batches: their announcements
    are declined before any download.
    May call: transfer (download) over the supervisor's P2P replica, PeerView (a pusher joins the view,
    a newcomer is greeted), Membership.read_announcements (for fetch), SwarmCounters, the LoopThread.
    Thread: announcements and downloads on the loop thread; the validator on the decode thread;
    `take` and `fetch` from the round loop.
    """

    def __init__(self, cfg: SwarmConfig, validate: Validator | None, *, view: PeerView, membership: Membership,
                 dht: DHTSupervisor, loop: LoopThread, counters: SwarmCounters, keep: int,
                 log: logging.Logger, batch_cap: int | None = None, params_cap: int | None = None,
                 rank: Rank | None = None) -> None:
        self.cfg = cfg
        self.validate = validate
        # the largest batch we download, and the largest DPO parameter payload (dpo.max_payload_bytes)
        self.batch_cap = min(cfg.max_batch_bytes, batch_cap or cfg.max_batch_bytes)
        self.params_cap = params_cap or cfg.max_batch_bytes
        self.keep = keep  # rounds a peer keeps (so an older round is known to be gone)
        self.log = log
        self.intake = Intake(
            Freshness(cfg.max_batch_age_s, cfg.max_version_lag, cfg.max_clock_skew_s, cfg.max_version_jump),
            max_batches=cfg.buffer_batches, max_bytes=cfg.buffer_bytes, max_size=self.batch_cap,
        )
        # the parts it calls
        self.view = view
        self.membership = membership
        self.dht = dht
        self.loop = loop
        self.counters = counters
        self._decoder = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="swarm-node-decode")
                         if validate is not None else None)
        self.rank = rank
        self._slots = DownloadSlots(MAX_DOWNLOADS, STRANGER_SLOTS if rank is not None else MAX_DOWNLOADS)
        self._failures: OrderedDict[str, int] = OrderedDict()  # peer -> downloads failed since its last success

    def close(self) -> None:
        if self._decoder is not None:
            self._decoder.shutdown(wait=False, cancel_futures=True)

    # ---- announcements in (loop thread) ----

    def on_announcement(self, peer_id: str, ann: BatchAnnouncement | None, problem: str, nbytes: int) -> None:
        """An authenticated peer announced a batch (or sent something invalid: `ann` None, `problem` why)."""
        self.counters.add("control_bytes_in", nbytes)
        self.counters.add("announcements_in")
        if ann is None:
            self.counters.reject(reasons.BAD_ANNOUNCEMENT, peer_id, problem)
            return
        member = MemberRecord(peer_id=peer_id, mode=ann.mode, model_name=ann.model_name,
                              tokenizer_fp=ann.tokenizer_fp, task_id=ann.task_id, round=ann.round,
                              updated=float(time.time()))
        if not self.view.accepts(member):
            self.counters.add(reasons.DECLINED)
            return
        if self.view.heard_from(peer_id, member):
            self.view.greet_newcomer(peer_id)  # it learns of our newest batch at once
        if self.validate is None:  # we take no batches
            self.counters.add(reasons.DECLINED)
            return
        offer = Offer(peer_id=peer_id, round=ann.round, version=ann.version, generated=ann.generated,
                      size=ann.size, sha256=ann.sha256, info={"member": member})
        verdict, to_fetch = self.intake.offer(offer)
        if verdict in reasons.OFFER_REASONS:  # counted by the intake; logged here, rate-limited
            self.counters.log_refusal(verdict, peer_id, f"batch round {ann.round} version {ann.version}, "
                                                        f"{ann.size} bytes")
        if to_fetch is not None:
            self.loop.spawn(self._download_offer(to_fetch))

    # ---- downloads and validation ----

    def download_deadline_s(self, size: int) -> float:
        """How long a download of `size` bytes may take: a start, then at least download_min_rate."""
        return min(self.cfg.collect_deadline_s, self.cfg.download_stall_s + size / self.cfg.download_min_rate)

    def _rank_of(self, peer_id: str) -> int:
        if self.rank is None:
            return 0
        try:
            return max(0, int(self.rank(peer_id)))
        except Exception:  # a rank hook that fails ranks the peer a stranger
            return 1

    def _note_outcome(self, peer_id: str, ok: bool) -> None:
        self._failures.pop(peer_id, None)
        if not ok:
            self._failures[peer_id] = self._failures.get(peer_id, 0) + 1
            while len(self._failures) > MAX_FAILURES_KEPT:
                self._failures.popitem(last=False)

    async def _download_offer(self, offer: Offer) -> None:
        """Background download of an accepted offer in a download slot, validated on the decode thread,
        into the intake buffer; then the peer's next offer."""
        payload = decoded = None
        rank = self._rank_of(offer.peer_id)
        try:
            # the slot bounds the payloads held while downloading or decoding
            await self._slots.acquire((rank, self._failures.get(offer.peer_id, 0)), stranger=rank > 0)
            try:
                entry = BlobEntry(round=offer.round, size=offer.size, sha256=offer.sha256)
                end = time.monotonic() + self.download_deadline_s(offer.size)
                for _attempt in range(FETCH_ATTEMPTS):
                    payload, reason = await self._download("batch", offer.peer_id, entry, end - time.monotonic())
                    if payload is not None or reason not in RETRIABLE or time.monotonic() >= end:
                        break
                    await asyncio.sleep(0.2)
                self._note_outcome(offer.peer_id, payload is not None)
                if payload is not None and self.loop.accepting:
                    decoded = await asyncio.get_running_loop().run_in_executor(
                        self._decoder, self._validated, offer, payload)
            finally:
                self._slots.release(stranger=rank > 0)
        finally:
            if decoded is None:
                payload = None  # failed or refused (counted): the peer's slot frees for its next offer
            nxt = self.intake.fetched(offer, payload, decoded)
            if nxt is not None:
                self.loop.spawn(self._download_offer(nxt))

    def _validated(self, offer: Offer, payload: bytes) -> Any:
        """On the decode thread: what the validator made of the payload, or None after counting and
        logging its refusal."""
        try:
            decoded = self.validate(payload, offer)
        except PayloadRefused as exc:
            self.counters.refuse_payload(exc.reason, offer.peer_id, offer.round, exc.detail)
            return None
        except Exception as exc:  # a validator must not raise; if it does, the batch is refused, not the node
            self.counters.reject(reasons.VALIDATE_ERROR, offer.peer_id,
                                 f"batch round {offer.round}: {type(exc).__name__}: {exc}")
            return None
        if decoded is None:
            self.counters.reject(reasons.VALIDATE_ERROR, offer.peer_id,
                                 f"batch round {offer.round}: the validator returned nothing")
        return decoded

    async def _download(self, kind: str, peer_id: str, entry: BlobEntry,
                        timeout: float) -> tuple[bytes | None, str | None]:
        """One download -> (payload, None), or (None, reason) after a counted, logged rejection."""
        limit = self.batch_cap if kind == "batch" else self.params_cap
        if entry.size > limit:
            self.counters.reject(reasons.TOO_LARGE, peer_id, f"{kind} round {entry.round}: announced {entry.size} "
                                 f"bytes > limit {limit}")
            return None, reasons.TOO_LARGE
        p2p = self.dht.p2p
        if p2p is None:
            self.counters.reject(reasons.STREAM_ERROR, peer_id, "P2P is restarting")
            return None, reasons.STREAM_ERROR
        try:
            payload = await with_deadline(
                download(p2p, peer_id, kind, entry.round, expected_size=entry.size, expected_sha256=entry.sha256,
                         max_bytes=limit, on_received=lambda n: self.counters.add("bytes_in", n),
                         stall_s=self.cfg.download_stall_s),
                timeout,
            )
        except TransferError as exc:
            self.counters.reject(exc.reason, peer_id, f"{kind} round {entry.round}: {exc.detail}")
            return None, exc.reason
        self.counters.add("received")
        return payload, None

    # ---- what the round takes ----

    def take(self, k: int, accept: Accept | None = None, *, lockstep: bool = False, round_: int = 0,
             staleness: int = 0, deadline_s: float = 0.0, choose: Callable[[list, int], list[int]] | None = None,
             closed: Callable[[], bool] = lambda: False) -> list[Received]:
        """Up to k buffered batches of distinct peers (see SwarmPeer.receive)."""
        def ok(offer: Offer) -> bool:
            return accepts(accept, offer.info["member"])

        min_round = round_ - staleness if lockstep else None
        if lockstep:
            end = time.monotonic() + deadline_s
            with self.intake.cond:
                while not closed():
                    want = min(k, self.view.count_accepted(accept))  # nobody else live: nothing to wait for
                    if self.intake.count_ready(ok, min_round=min_round) >= want:
                        break
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self.intake.cond.wait(min(left, POLL_S))
        taken, refetch = self.intake.take(k, ok, min_round=min_round, choose=choose)
        for offer in refetch:
            self.loop.submit(self._download_offer(offer))
        out = []
        for b, (age, lag) in zip(taken, self.intake.ages(taken), strict=True):
            o = b.offer
            out.append(Received(o.peer_id, o.round, b.payload, o.info.get("member"), o.version, age, lag, b.arrived,
                                b.decoded))
        return out

    # ---- DPO: one peer's blob for one round ----

    def fetch(self, kind: str, peer_id: str, round_: int, deadline_s: float) -> bytes | None:
        """One peer's blob for one round, waiting until it is announced in the DHT (up to the deadline)."""
        try:
            return self.loop.run(self._fetch(kind, peer_id, int(round_), deadline_s), deadline_s + 10)
        except Exception as exc:
            self.log.warning("fetch(%s, %s, round %d) failed: %s", kind, peer_id, round_, exc)
            return None

    async def _fetch(self, kind: str, peer_id: str, round_: int, deadline_s: float) -> bytes | None:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        end = t0 + deadline_s
        attempts = 0
        failing_since = None  # first failure to reach the peer or to get bytes from it
        while time.monotonic() < end:
            ann = (await loop.run_in_executor(None, self.membership.read_announcements, kind)).get(peer_id)
            entry = ann.entry(round_) if ann else None
            if entry is not None:
                attempts += 1
                payload, reason = await self._download(kind, peer_id, entry, end - time.monotonic())
                failing_since = failing_since or time.monotonic()
                if (payload is not None or reason not in FETCH_RETRIABLE
                        or time.monotonic() - failing_since >= FETCH_RETRY_S):
                    self.log.debug("fetch(%s, %s, round %d): %s after %.2fs, %d attempt(s)", kind, peer_id, round_,
                                   f"{len(payload)} bytes" if payload is not None else reason,
                                   time.monotonic() - t0, attempts)
                    return payload
                # a dropped or silent stream, a peer not reachable yet (its DHT child restarting): again
                await asyncio.sleep(min(FETCH_RETRY_PAUSE_S, max(end - time.monotonic(), 0.0)))
                continue
            if ann is not None and ann.latest is not None and ann.latest.round > round_ and len(ann.blobs) >= self.keep:
                self.log.debug("fetch(%s, %s, round %d): no longer kept (it announces %s) after %.2fs", kind, peer_id,
                               round_, [b.round for b in ann.blobs], time.monotonic() - t0)
                return None  # that round is no longer kept by the peer
            await asyncio.sleep(min(POLL_S, max(end - time.monotonic(), 0.0)))
        self.counters.reject(reasons.TIMEOUT, peer_id, f"{kind} round {round_} not announced within {deadline_s:.1f}s")
        return None
