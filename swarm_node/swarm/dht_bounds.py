"""What peers can make a DHT child store and spend: bounded storage and bounded StoreRequests.

hivemind answers a StoreRequest in one synchronous pass over its records on the DHT child's event loop
(`DHTProtocol.rpc_store`), and every other RPC of that child (finds, pings, our own stores) waits until it
ends. A request can carry ~110,000 one-byte records within hivemind's 4 MiB message cap. Two things made
that a stall of minutes: our storage bound counted every stored entry for each new one (quadratic), and
nothing bounded the records of one request. So here:

- `BoundedStorage` keeps the per-key and total bounds at O(1) per entry: a running count of the entries it
  added (an upper bound, since expired entries leave without telling it), recounted exactly only when it
  reaches the bound, at most once per RECOUNT_S.
- `GuardedDHTProtocol.rpc_store` refuses a request with more than MAX_STORE_KEYS keys or MAX_STORE_RECORDS
  records, or a dictionary value of more than MAX_SUBKEYS_PER_KEY subkeys (counted from its msgpack
  headers, before it is decoded), as `store_too_large`, and yields to the event loop after every
  STORE_CHUNK records of the rest, so one request delays other RPCs by one chunk (~2 ms), not by all of it.

Both are installed in the DHT child only (`install`, from swarm.dht's child process). Thread: the
child's event loop.
"""

from __future__ import annotations

import asyncio
import time

import hivemind.dht.node
import msgpack
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import P2PContext
from hivemind.proto import dht_pb2

from swarm_node.swarm import reasons
from swarm_node.swarm.records import refuse, shard_of_key
from swarm_node.swarm.sampling import SHARD_SUBKEYS

MAX_SUBKEYS_PER_KEY = 1024  # keeps one key's dictionary far below hivemind's 4 MiB message cap
MAX_STORED_ENTRIES = 32_768  # records held by one DHT peer: at most ~128 MiB of values
RECOUNT_S = 1.0  # a full storage recounts its entries at most this often (the rest of the time it refuses)
MAX_STORE_KEYS = 256
"""Keys in one StoreRequest. Our nodes store one key per request; hivemind's transfer of stored values to
a new neighbour sends every key it holds for it in one request (a few per swarm)."""
MAX_STORE_RECORDS = 4 * MAX_SUBKEYS_PER_KEY
"""Records in one StoreRequest, dictionary subkeys counted: room for the three full dictionaries (members,
batches, parameters) of a swarm that a transfer to a new neighbour may carry, and one more."""
STORE_CHUNK = 64  # keys stored between two yields to the event loop
_DICTIONARY_EXT = 0x50  # hivemind's msgpack ext code of DictionaryDHTValue (hivemind/dht/storage.py)


def _entries(value) -> int:
    return len(value) if isinstance(value, DictionaryDHTValue) else 1


class BoundedStorage(DHTLocalStorage):
    """DHTLocalStorage that refuses a new subkey when its key holds `max_subkeys`, and any new entry when it
    holds `max_entries`, in O(1) per entry (amortized over the recounts).

    Refreshing an entry that is already held is always allowed, so a flood of fake identities cannot evict
    honest peers already listed; it can only fill the remaining room. A shard key of sampled membership (known
    by its DHTID, records.shard_of_key) holds at most `shard_subkeys`, so a reply stays < 250 KB.
    """

    def __init__(self, maxsize: int | None = None, *, max_subkeys: int = MAX_SUBKEYS_PER_KEY,
                 max_entries: int = MAX_STORED_ENTRIES, clock=time.monotonic,
                 shard_subkeys: int = SHARD_SUBKEYS) -> None:
        super().__init__(maxsize)
        self.max_subkeys = max_subkeys
        self.shard_subkeys = shard_subkeys
        self.max_entries = max_entries
        self.clock = clock
        self.counted = 0  # entries added since the last recount, plus what that recount found (>= the truth)
        self._recounted_at = float("-inf")

    def recount(self) -> int:
        """The exact number of entries held (a walk over every key); resets the running count."""
        self.counted = sum(_entries(item.value) for _key, item in self.items())
        self._recounted_at = self.clock()
        return self.counted

    def _room(self) -> bool:
        if self.counted < self.max_entries:
            return True
        if self.clock() - self._recounted_at < RECOUNT_S:
            return False
        return self.recount() < self.max_entries

    def store(self, key, value, expiration_time, subkey=None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        current = self.get(key)
        if current is None:
            if not self._room():
                return refuse(reasons.STORAGE_FULL, f"{self.max_entries} records stored")
            stored = super().store(key, value, expiration_time)
            self.counted += stored
            return stored
        return super().store(key, value, expiration_time)

    def store_subkey(self, key, subkey, value, expiration_time) -> bool:
        current = self.get(key)
        held = current.value if current is not None else None
        listed = isinstance(held, DictionaryDHTValue)
        if listed and subkey in held:  # a refresh
            return super().store_subkey(key, subkey, value, expiration_time)
        if listed:
            cap = min(self.max_subkeys, self.shard_subkeys) if shard_of_key(key) is not None else self.max_subkeys
            if len(held) >= cap:
                return refuse(reasons.SUBKEYS_FULL, f"a key already holds {cap} subkeys")
        if not self._room():
            return refuse(reasons.STORAGE_FULL, f"{self.max_entries} records stored")
        stored = super().store_subkey(key, subkey, value, expiration_time)
        self.counted += stored
        return stored


def dictionary_size(value: bytes) -> int:
    """Subkeys in a serialized DictionaryDHTValue, read from its msgpack headers without decoding the
    items (1 for anything else: hivemind refuses that itself)."""
    try:
        outer = msgpack.unpackb(value, raw=False)  # no ext hook: the ext's payload stays bytes
        if not isinstance(outer, msgpack.ExtType) or outer.code != _DICTIONARY_EXT:
            return 1
        inner = msgpack.Unpacker(raw=False)
        inner.feed(outer.data)
        if inner.read_array_header() != 3:  # [maxsize, latest expiration, items]
            return 1
        inner.skip()
        inner.skip()
        return int(inner.read_array_header())
    except Exception:
        return 1


class _Pacer:
    """Yields to the event loop once every `every` records."""

    def __init__(self, every: int) -> None:
        self.every, self.done = every, 0

    async def tick(self) -> None:
        self.done += 1
        if self.done % self.every == 0:
            await asyncio.sleep(0)


class GuardedDHTProtocol(DHTProtocol):
    """hivemind's DHTProtocol with bounded storage and bounded, chunked StoreRequests (module docstring).

    Its RPCs keep hivemind's names (`DHTProtocol.rpc_*`), so peers see the same protocol.
    """

    @classmethod
    def _get_handle_name(cls, namespace, method_name: str) -> str:
        return DHTProtocol._get_handle_name(namespace, method_name)

    def __setattr__(self, name: str, value) -> None:
        # DHTProtocol.create makes its storage and cache as plain DHTLocalStorage (no hook to pass a class)
        if name in ("storage", "cache") and type(value) is DHTLocalStorage:
            value = BoundedStorage(value.maxsize if value.maxsize != float("inf") else None)
        super().__setattr__(name, value)

    async def rpc_store(self, request: dht_pb2.StoreRequest, context: P2PContext) -> dht_pb2.StoreResponse:
        """hivemind's rpc_store (same checks, same answers), bounded in size and paced (module docstring)."""
        n = len(request.keys)
        if not len(request.subkeys) == len(request.values) == len(request.expiration_time) == len(request.in_cache) == n:
            refuse(reasons.STORE_MALFORMED, f"a StoreRequest whose fields list different numbers of records "
                   f"from {context.remote_id}")
            return dht_pb2.StoreResponse(store_ok=[False] * n, peer=self.node_info)
        sizes = [dictionary_size(v) if t == self.IS_DICTIONARY else 1
                 for t, v in zip(request.subkeys, request.values, strict=True)] if n <= MAX_STORE_KEYS else []
        if n > MAX_STORE_KEYS or sum(sizes) > MAX_STORE_RECORDS or max(sizes, default=0) > MAX_SUBKEYS_PER_KEY:
            refuse(reasons.STORE_TOO_LARGE, f"a StoreRequest of {n} keys, {sum(sizes) if sizes else n} records, at "
                   f"most {max(sizes, default=1)} under one key (limits: {MAX_STORE_KEYS} keys, {MAX_STORE_RECORDS} "
                   f"records, {MAX_SUBKEYS_PER_KEY} under one key) from {context.remote_id}")
            return dht_pb2.StoreResponse(store_ok=[False] * n, peer=self.node_info)
        if request.peer:  # as hivemind: the sender may join our routing table
            asyncio.create_task(self.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
        response = dht_pb2.StoreResponse(store_ok=[], peer=self.node_info)
        pacer = _Pacer(STORE_CHUNK)
        for key, tag, value, expiration, in_cache in zip(request.keys, request.subkeys, request.values,
                                                         request.expiration_time, request.in_cache, strict=True):
            key_id = DHTID.from_bytes(key)
            storage = self.cache if in_cache else self.storage
            if tag == self.IS_DICTIONARY:
                ok = await self._store_dictionary(key, key_id, value, storage, pacer)
            elif not self._validate_record(key, tag, value, expiration):
                ok = False
            elif tag == self.IS_REGULAR_VALUE:
                ok = storage.store(key_id, value, expiration)
            else:
                ok = storage.store_subkey(key_id, self.serializer.loads(tag), value, expiration)
            response.store_ok.append(ok)
            await pacer.tick()
        return response

    async def _store_dictionary(self, key: bytes, key_id: DHTID, value: bytes, storage, pacer: _Pacer) -> bool:
        """A whole dictionary value, as hivemind stores one: every item validated first, then stored until
        one is refused."""
        dictionary = self.serializer.loads(value)
        if not isinstance(dictionary, DictionaryDHTValue):
            return refuse(reasons.STORE_MALFORMED, "a dictionary store whose value is not a dictionary")
        with dictionary.freeze():
            items = [(subkey, v, exp) for subkey, (v, exp) in dictionary.items()]
        for subkey, v, exp in items:
            record = DHTRecord(key, self.serializer.dumps(subkey), v, exp)
            if self.record_validator is not None and not self.record_validator.validate(record):
                return False
            await pacer.tick()
        for subkey, v, exp in items:
            if not storage.store_subkey(key_id, subkey, v, exp):
                return False
            await pacer.tick()
        return True


def install() -> None:
    """In the DHT child, before hivemind creates its DHTNode: use GuardedDHTProtocol."""
    hivemind.dht.node.DHTProtocol = GuardedDHTProtocol
