"""A DHT StoreRequest flood and a find probe, for tests and benchmarks/dht_flood.py (test tooling).

The flood is sent by a real hivemind DHT peer (`hivemind.DHT`, its own p2pd) straight through
hivemind's RPC stub, so the victim receives exactly what a hostile peer can send: a StoreRequest up to
the 4 MiB message cap of hivemind's persistent connection (`DEFAULT_MAX_MSG_SIZE`), full of the cheapest
records the request can hold. The probe is another real hivemind DHT peer that times `rpc_find` calls
(one RPC, no beam search around it) against the victim while the flood runs.

    shapes: plain       N keys with a 1-byte value each (~40 bytes a record)
            subkeys     N subkeys of 8 keys, 1-byte values
            dictionary  one key whose value is a dictionary of N subkeys (IS_DICTIONARY)
            within_bounds  4 dictionaries of 1,024 subkeys: the largest request swarm-node's bounds store
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time

import hivemind
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.control import DEFAULT_MAX_MSG_SIZE
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
SHAPES = ("plain", "subkeys", "dictionary", "within_bounds")
MAX_REQUEST_BYTES = DEFAULT_MAX_MSG_SIZE - 4096  # the message cap, less room for framing


def _dictionary(tag: str, n: int, exp: float) -> DictionaryDHTValue:
    d = DictionaryDHTValue()
    with d.freeze():
        for i in range(n):
            d.store(f"{tag}{i}".encode(), b"x", exp)
    return d


def store_request(shape: str, max_bytes: int = MAX_REQUEST_BYTES, seed: int = 0) -> dht_pb2.StoreRequest:
    """The largest StoreRequest of `shape` that fits `max_bytes` when serialized (every record fresh);
    `within_bounds`: four dictionaries of 1,024 subkeys, the most records a swarm-node DHT peer stores from
    one request."""
    exp = get_dht_time() + 600
    tag = os.urandom(4).hex() + str(seed)
    if shape in ("dictionary", "within_bounds"):
        n, keys = (max_bytes // 30, 1) if shape == "dictionary" else (1024, 4)
        values = [MSGPackSerializer.dumps(_dictionary(f"{tag}d{j}_", n, exp)) for j in range(keys)]
        while sum(map(len, values)) > max_bytes - 256:  # trim until it fits
            n = int(n * 0.95)
            values = [MSGPackSerializer.dumps(_dictionary(f"{tag}d{j}_", n, exp)) for j in range(keys)]
        return dht_pb2.StoreRequest(keys=[DHTID.generate(source=f"{tag}dict{j}").to_bytes() for j in range(keys)],
                                    subkeys=[DHTProtocol.IS_DICTIONARY] * keys, values=values,
                                    expiration_time=[exp] * keys, in_cache=[False] * keys)
    req = dht_pb2.StoreRequest()
    keys = [DHTID.generate(source=f"{tag}k{i}").to_bytes() for i in range(8)]
    i = 0
    per = None
    while True:
        if shape == "plain":
            key, sub = DHTID.generate(source=f"{tag}{i}").to_bytes(), DHTProtocol.IS_REGULAR_VALUE
        else:
            key, sub = keys[i % 8], MSGPackSerializer.dumps(f"{tag}{i}".encode())
        req.keys.append(key)
        req.subkeys.append(sub)
        req.values.append(b"x")
        req.expiration_time.append(exp)
        req.in_cache.append(False)
        i += 1
        if i == 256:
            per = req.ByteSize() / i
        if per is not None and i % 1024 == 0 and req.ByteSize() + 2048 * per > max_bytes:
            break
    return req


async def _flood(victim: bytes, shape: str, concurrency: int, duration_s: float, _dht, node) -> dict:
    """In the flooder's DHT child (a pipe to it cannot carry 4 MiB at once): build requests of `shape`
    and send them back to back for duration_s -> counts."""
    stub = node.protocol.get_stub(PeerID(victim))
    requests = [store_request(shape, seed=i) for i in range(4)]
    counts = {"sent": 0, "answered": 0, "refused_records": 0}
    end = time.monotonic() + duration_s

    async def worker(w: int) -> None:
        j = w
        while time.monotonic() < end:
            counts["sent"] += 1
            try:
                resp = await stub.rpc_store(requests[j % len(requests)], timeout=max(end - time.monotonic(), 0.1) + 60)
                counts["answered"] += 1
                counts["refused_records"] += sum(not ok for ok in resp.store_ok)
            except Exception:
                await asyncio.sleep(0.05)
            j += 1

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return counts


async def _find_once(victim: bytes, key: bytes, timeout_s: float, _dht, node) -> float:
    stub = node.protocol.get_stub(PeerID(victim))
    t0 = time.perf_counter()
    try:
        await stub.rpc_find(dht_pb2.FindRequest(keys=[key], peer=node.protocol.node_info), timeout=timeout_s)
    except Exception:
        return timeout_s
    return time.perf_counter() - t0


def _peer_of(maddrs: list[str]) -> bytes:
    return PeerID.from_base58(maddrs[0].rsplit("/p2p/", 1)[1]).to_bytes()


class Flooder:
    """A hivemind DHT peer sending StoreRequests to one victim, back to back, for a while (in its child)."""

    def __init__(self, victim_maddrs: list[str], shape: str, concurrency: int = 2) -> None:
        self.victim = _peer_of(victim_maddrs)
        self.dht = hivemind.DHT(initial_peers=victim_maddrs, host_maddrs=LOOPBACK, start=True, client_mode=True)
        self.shape = shape
        self.concurrency = concurrency
        req = store_request(shape)
        self.request_bytes = req.ByteSize()
        self.records = sum(len(MSGPackSerializer.loads(v).data) if t == DHTProtocol.IS_DICTIONARY else 1
                           for t, v in zip(req.subkeys, req.values, strict=True))
        self.counts: dict = {}
        self._future = None

    def start(self, duration_s: float) -> Flooder:
        self._future = self.dht.run_coroutine(
            functools.partial(_flood, self.victim, self.shape, self.concurrency, duration_s), return_future=True)
        return self

    def join(self, timeout_s: float = 300.0) -> dict:
        self.counts = self._future.result(timeout_s)
        return self.counts

    def stop(self) -> None:
        self.dht.shutdown()


class FindProbe:
    """A hivemind DHT peer timing one `rpc_find` after another against the victim (each bounded)."""

    def __init__(self, victim_maddrs: list[str], key: str = "probe_key") -> None:
        self.victim = _peer_of(victim_maddrs)
        self.dht = hivemind.DHT(initial_peers=victim_maddrs, host_maddrs=LOOPBACK, start=True)
        self.key = DHTID.generate(source=key).to_bytes()

    def probe(self, duration_s: float, period_s: float = 0.2, timeout_s: float = 30.0) -> list[float]:
        """Seconds each find took (timeout_s for one that got no answer), one every period_s."""
        out = []
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            out.append(self.dht.run_coroutine(functools.partial(_find_once, self.victim, self.key, timeout_s)))
            time.sleep(period_s)
        return out

    def stop(self) -> None:
        self.dht.shutdown()


def summary(latencies: list[float]) -> dict:
    s = sorted(latencies)
    return {"n": len(s), "median_s": round(statistics.median(s), 4) if s else None,
            "p90_s": round(s[int(0.9 * (len(s) - 1))], 4) if s else None, "max_s": round(s[-1], 4) if s else None}
