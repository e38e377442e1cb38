"""SwarmNode: membership heartbeats, signed announcements and blob exchange, on a supervised DHT.

Threads: the caller's thread (publish/collect/fetch), one uvloop event-loop thread (P2P streams), one
heartbeat thread (membership, re-announcements, and restarting the DHT child if it dies). Calls into the
DHT child go through one lock so its pipe is written by one thread at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import uvloop

from swarm_node.config import SwarmConfig
from swarm_node.swarm import records as R
from swarm_node.swarm.dht import RefusalTally, ensure_identity, kill_dht, start_dht, wait_dht_result
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
        self._keep = min(max(2, cfg.staleness_rounds + 1), R.MAX_ANNOUNCED_ROUNDS)
        self._blobs: dict[str, OrderedDict[int, tuple[bytes, R.BlobEntry]]] = {k: OrderedDict() for k in R.KINDS}
        self._blob_lock = threading.Lock()
        self._consumed: set[tuple[str, str, int]] = set()
        self._counts = {"bytes_in": 0, "bytes_out": 0, "received": 0, "served": 0, "declined": 0, "dht_restarts": 0}
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
        with self._stat_lock:
            return {**self._counts, "rejected": dict(self._rejected)}

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

    def _read_members(self) -> dict[str, R.MemberRecord]:
        return self._read_signed(R.members_key(self.cfg.swarm_id), R.MemberRecord)

    def _read_announcements(self, kind: str) -> dict[str, R.Announcement]:
        return self._read_signed(R.blobs_key(self.cfg.swarm_id, kind), R.Announcement)

    def _read_signed(self, key: str, model) -> dict:
        """Entries under `key` whose record names the peer id of the key that signed it."""
        try:
            found = self._dht_call("get", key, latest=True)
        except Exception as exc:
            self.log.debug("reading %s failed: %s", key, exc)
            return {}
        records, problems = R.parse_signed(found.value if found is not None else None, model)
        for owner, detail, once in problems:
            self._reject("bad_record", owner, f"{key}: {detail}", once=(key, *once))
        return records

    # ---- blobs ----

    def publish(self, kind: str, round: int, payload: bytes) -> None:
        """Keep `payload` for the last few rounds and announce (round, size, sha256) to the swarm."""
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
        self._announce(kind)

    def _announce(self, kind: str) -> None:
        with self._blob_lock:
            entries = [e.model_dump() for _p, e in self._blobs[kind].values()]
        if not entries:
            return
        value = {"peer_id": self.peer_id, "updated": float(time.time()), "blobs": entries}
        self._store(R.blobs_key(self.cfg.swarm_id, kind), value)

    def _store(self, key: str, value) -> bool:
        try:
            ok = self._dht_call("store", key, value, time.time() + self.cfg.record_ttl_s, subkey=self._subkey)
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

    def collect(
        self, kind: str, round: int, *, k: int, staleness: int, deadline_s: float,
        accept: Callable[[R.MemberRecord], bool] | None = None,
    ) -> list[Received]:
        """Pull fresh, not yet consumed blobs of up to k random peers in parallel, until the deadline.

        Returns early once it holds blobs from min(k, number of other accepted live peers) peers.
        Failures are counted and logged, never raised.
        """
        if k <= 0 or self._closed:
            return []
        try:
            return self._run(self._collect(kind, int(round), k, staleness, deadline_s, accept), deadline_s + 10)
        except Exception as exc:
            self.log.warning("collect(%s, round %d) failed: %s", kind, round, exc)
            return []

    def fetch(self, kind: str, peer_id: str, round: int, deadline_s: float) -> bytes | None:
        """One peer's blob for one round, waiting until it is announced (up to the deadline)."""
        if self._closed:
            return None
        try:
            return self._run(self._fetch(kind, peer_id, int(round), deadline_s), deadline_s + 10)
        except Exception as exc:
            self.log.warning("fetch(%s, %s, round %d) failed: %s", kind, peer_id, round, exc)
            return None

    async def _collect(self, kind, round_, k, staleness, deadline_s, accept) -> list[Received]:
        loop = asyncio.get_running_loop()
        end = time.monotonic() + deadline_s
        results: list[Received] = []
        running: dict[asyncio.Task, tuple[str, R.BlobEntry, R.MemberRecord | None]] = {}
        tried: set[str] = set()
        attempts: Counter[str] = Counter()
        failed = 0
        want = k
        self._consumed = {c for c in self._consumed if c[2] >= round_ - staleness - 1}  # bounded memory
        try:
            while time.monotonic() < end and len(results) < k:
                anns = await loop.run_in_executor(None, self._read_announcements, kind)
                members = await loop.run_in_executor(None, self._read_members)
                others = [m for pid, m in members.items() if pid != self.peer_id and self._accepts(accept, m)]
                want = min(k, max(len(others) - failed, 0))
                fresh = []
                for pid, ann in anns.items():
                    entry = ann.latest
                    if pid == self.peer_id or pid in tried or entry is None or entry.round < round_ - staleness:
                        continue
                    if (kind, pid, entry.round) in self._consumed:
                        continue
                    member = members.get(pid)
                    if accept is not None and (member is None or not self._accepts(accept, member)):
                        tried.add(pid)
                        with self._stat_lock:
                            self._counts["declined"] += 1
                        continue
                    fresh.append((pid, entry, member))
                random.shuffle(fresh)
                for pid, entry, member in fresh[: max(k - len(results) - len(running), 0)]:
                    tried.add(pid)
                    attempts[pid] += 1
                    task = asyncio.ensure_future(self._download(kind, pid, entry, end - time.monotonic()))
                    running[task] = (pid, entry, member)
                if not running and len(results) >= want:
                    break
                wait = min(POLL_S, max(end - time.monotonic(), 0.0))
                if running:
                    done, _ = await asyncio.wait(running, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                else:
                    done = set()
                    await asyncio.sleep(wait)
                for task in done:
                    pid, entry, member = running.pop(task)
                    payload, reason = task.result()
                    if payload is not None:
                        self._consumed.add((kind, pid, entry.round))
                        results.append(Received(pid, entry.round, payload, member))
                    elif reason in RETRIABLE and attempts[pid] < FETCH_ATTEMPTS:
                        tried.discard(pid)  # picked again at the next poll, while the deadline allows
                    else:
                        self._consumed.add((kind, pid, entry.round))
                        failed += 1
        finally:
            for task, (pid, entry, _m) in running.items():
                task.cancel()
                self._reject("timeout", pid, f"{kind} round {entry.round} not complete at the deadline")
        return results

    @staticmethod
    def _accepts(accept, member: R.MemberRecord) -> bool:
        if accept is None:
            return True
        try:
            return bool(accept(member))
        except Exception:
            return False

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
            await p2p.add_binary_stream_handler(HANDLER, make_handler(self._lookup, self._count_out, self._reject,
                                                                   kinds=frozenset(R.KINDS)))
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
        for reason, n in self._refusals.poll(self._dht_call).items():
            with self._stat_lock:
                self._rejected[reason] = self._rejected.get(reason, 0) + n
        self._store(R.members_key(self.cfg.swarm_id), self._member_record())
        for kind in R.KINDS:
            self._announce(kind)

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
        self._heartbeat()
        self.log.warning("DHT restarted and swarm rejoined in %.1fs", time.monotonic() - t0)
