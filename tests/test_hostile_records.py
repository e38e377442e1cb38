"""Hostile DHT records (docs/security.md: junk under other swarms' keys, bloated keys and storage).

Shapes are checked under every swarm's keys, sizes, lifetimes and subkeys per key bounded. Unit tests run the real hivemind validators on DHTRecords; the slow test floods
a real SwarmPeer's DHT child from an attacker's hivemind DHT on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.p2p import P2P
from hivemind.proto import dht_pb2
from hivemind.utils.serializer import MSGPackSerializer as S
from hivemind.utils.timed_storage import get_dht_time

from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer, dht_bounds, records, sampling
from swarm_node.swarm.dht import RefusalTally, record_refusals
from tooling import dht_flood


def _identity(tmp_path: Path, name: str):
    path = tmp_path / name
    P2P.generate_identity(str(path))
    key = records.load_identity_key(str(path))
    return key, records.subkey_for(key), records.peer_id_of_subkey(records.subkey_for(key))


def _member(peer_id: str) -> dict:
    return dict(peer_id=peer_id, mode="grpo", model_name="m", tokenizer_fp="t", task_id="x", round=0,
                updated=time.time(), arch_fp="", client_mode=False, level=0)


def _signed(key, key_name: str, subkey: bytes, value, ttl: float = 60.0) -> DHTRecord:
    """A record as the owner of `key` would store it (signature appended by its own validators)."""
    rec = DHTRecord(DHTID.generate(source=key_name).to_bytes(), S.dumps(subkey), S.dumps(value), time.time() + ttl)
    return dataclasses.replace(rec, value=CompositeValidator([RSASignatureValidator(key)]).sign_value(rec))


@pytest.fixture()
def victim(tmp_path):
    key, _sub, _pid = _identity(tmp_path, "victim")
    records.REFUSALS.clear()
    return CompositeValidator(records.make_validators("mine", key))


def test_signed_junk_under_another_swarms_key_is_refused(tmp_path, victim) -> None:
    """Before: only the node's own --swarm prefix was checked, so any other swarm's keys took anything."""
    key, sub, pid = _identity(tmp_path, "attacker")
    for junk in ({"peer_id": pid, "x": "y" * 100}, [1, 2, 3], "garbage", {"peer_id": pid, "blobs": "no"}):
        assert victim.validate(_signed(key, "other_members", sub, junk)) is False
    assert records.REFUSALS["record_shape"] == 4
    assert victim.validate(_signed(key, "other_members", sub, _member(pid))) is True
    ann = {"peer_id": pid, "updated": time.time(), "blobs": [{"round": 1, "size": 10, "sha256": "0" * 64}]}
    assert victim.validate(_signed(key, "whatever_batch", sub, ann)) is True
    assert victim.validate(_signed(key, "other_members", sub, None)) is True  # a withdrawal


def test_a_record_naming_another_peer_is_refused_under_any_key(tmp_path, victim) -> None:
    key, sub, _pid = _identity(tmp_path, "attacker")
    _k2, _s2, honest = _identity(tmp_path, "honest")
    assert victim.validate(_signed(key, "other_members", sub, _member(honest))) is False
    assert records.REFUSALS["record_owner"] == 1


def test_size_and_lifetime_bounds_apply_to_every_record(tmp_path, victim) -> None:
    key, sub, pid = _identity(tmp_path, "attacker")
    unsigned = DHTRecord(DHTID.generate(source="any").to_bytes(), S.dumps(b"peer"), S.dumps({"a": 1}), time.time() + 60)
    assert victim.validate(unsigned) is True  # foreign (e.g. hivemind averaging) records stay usable
    big = dataclasses.replace(unsigned, value=S.dumps(b"x" * (records.MAX_RECORD_BYTES + 1)))
    assert victim.validate(big) is False
    forever = dataclasses.replace(unsigned, expiration_time=time.time() + 10 * records.MAX_RECORD_TTL_S)
    assert victim.validate(forever) is False
    assert victim.validate(_signed(key, "other_members", sub, _member(pid), ttl=10 * records.MAX_RECORD_TTL_S)) is False
    assert records.REFUSALS["record_too_large"] == 1 and records.REFUSALS["record_ttl"] == 2


def test_storage_bounds_subkeys_per_key_and_in_total() -> None:
    records.REFUSALS.clear()
    st = dht_bounds.BoundedStorage(max_subkeys=5, max_entries=11)
    key = DHTID.generate(source="members")
    exp = get_dht_time() + 60
    assert all(st.store(key, b"v", exp, subkey=f"peer{i}".encode()) for i in range(5))
    assert st.store(key, b"v", exp, subkey=b"sybil") is False  # the key is full...
    assert st.store(key, b"v2", exp + 1, subkey=b"peer0") is True  # ...but listed peers still refresh
    assert records.REFUSALS["subkeys_full"] == 1
    for j in range(6):
        st.store(DHTID.generate(source=f"k{j}"), b"v", exp)
    assert len(st) == 7
    assert st.store(DHTID.generate(source="one-too-many"), b"v", exp) is False
    assert records.REFUSALS["storage_full"] >= 1


def _member_at(peer_id: str, level: int) -> dict:
    return {**_member(peer_id), "level": level}


def test_shard_keys_take_only_signed_member_records_of_a_peer_in_that_shard(tmp_path, victim) -> None:
    """Sampled membership's `{swarm}_m{level}_{shard}` keys (ShardGuard): an unsigned record passes RecordGuard
    under any other key, and an announcement is a valid signed record, but neither belongs in a shard."""
    key, sub, pid = _identity(tmp_path, "writer")
    _k2, _s2, honest = _identity(tmp_path, "honest")
    mine = sampling.shard_key("mine", 2, sampling.shard_of(pid, 2))
    assert victim.validate(_signed(key, mine, sub, _member_at(pid, 2))) is True
    assert victim.validate(_signed(key, mine, sub, _member_at(pid, 3))) is True  # a writer one level deeper
    assert victim.validate(_signed(key, mine, sub, None)) is True  # a withdrawal
    records.REFUSALS.clear()
    unsigned = DHTRecord(DHTID.generate(source=mine).to_bytes(), S.dumps(b"peer"), S.dumps(_member_at(pid, 2)),
                         time.time() + 60)
    assert victim.validate(unsigned) is False
    ann = {"peer_id": pid, "updated": time.time(), "blobs": [{"round": 1, "size": 10, "sha256": "0" * 64}]}
    assert victim.validate(_signed(key, mine, sub, ann)) is False
    assert victim.validate(_signed(key, mine, sub, _member_at(pid, 4))) is False  # not a level that writes here
    assert records.REFUSALS["record_shape"] == 2 and records.REFUSALS["record_owner"] == 1
    level = next(lv for lv in range(4, 15) if sampling.shard_of(pid, lv) != sampling.shard_of(honest, lv))
    theirs = sampling.shard_key("mine", level, sampling.shard_of(honest, level))
    assert victim.validate(_signed(key, theirs, sub, _member_at(pid, level))) is False  # not its shard
    assert victim.validate(_signed(key, theirs, sub, _member_at(honest, level))) is False  # signed by another
    assert records.REFUSALS["record_owner"] == 3
    records.register_shard_swarms(["other"])  # known in this process (status reads it), but not the victim's swarm
    assert victim.validate(_signed(key, "other_m2_0", sub, _member_at(pid, 9))) is True  # not our swarm's shard


def test_a_shard_key_holds_48_subkeys_and_still_takes_refreshes() -> None:
    records.REFUSALS.clear()
    records.register_shard_swarms(["mine"])
    st = dht_bounds.BoundedStorage()
    shard = DHTID.generate(source=sampling.shard_key("mine", 3, 5))
    exp = get_dht_time() + 60
    assert all(st.store(shard, b"v", exp, subkey=f"peer{i}".encode()) for i in range(sampling.SHARD_SUBKEYS))
    assert st.store(shard, b"v", exp, subkey=b"sybil") is False  # the 49th identity
    assert st.store(shard, b"v2", exp + 1, subkey=b"peer0") is True  # a listed peer refreshes
    assert records.REFUSALS["subkeys_full"] == 1
    other = DHTID.generate(source="mine_members")  # other keys keep their cap
    assert all(st.store(other, b"v", exp, subkey=f"peer{i}".encode()) for i in range(2 * sampling.SHARD_SUBKEYS))


class _CountedWalks(dht_bounds.BoundedStorage):
    walks = 0

    def items(self):
        type(self).walks += 1
        return super().items()


def test_the_storage_bound_costs_no_walk_per_entry() -> None:
    """Before: each new entry walked every stored entry (20k one-byte records took 28-51 s to store), and a
    refused one still cost ~3 ms. Now entries are counted as they come; a full storage recounts at most once
    per RECOUNT_S, and otherwise refuses at once."""
    now = [0.0]
    st = _CountedWalks(max_entries=2_000, clock=lambda: now[0])
    exp = get_dht_time() + 60
    assert all(st.store(DHTID.generate(source=f"k{i}"), b"v", exp) for i in range(1_500))
    key = DHTID.generate(source="members")
    assert all(st.store(key, b"v", exp, subkey=f"p{i}".encode()) for i in range(500))
    assert _CountedWalks.walks == 0
    assert not any(st.store(DHTID.generate(source=f"late{i}"), b"v", exp) for i in range(1_000))
    assert _CountedWalks.walks == 1  # one recount found it full; the next 999 refusals cost none
    now[0] += dht_bounds.RECOUNT_S
    st.data.pop(next(iter(st.data)))  # an entry left (as an expired one does, without telling the count)
    assert st.store(DHTID.generate(source="room again"), b"v", exp) is True
    assert _CountedWalks.walks == 2 and st.counted == 2_000


def test_a_dictionarys_size_is_read_from_its_headers() -> None:
    d = DictionaryDHTValue()
    for i in range(300):
        d.store(f"s{i}".encode(), b"v", get_dht_time() + 60)
    assert dht_bounds.dictionary_size(S.dumps(d)) == 300
    assert dht_bounds.dictionary_size(b"\xc1 not msgpack") == 1
    assert dht_bounds.dictionary_size(S.dumps([1, 2, 3])) == 1


class _Ctx:
    remote_id = "attacker"


def _protocol() -> dht_bounds.GuardedDHTProtocol:
    """The guarded protocol's store path without a p2pd (what rpc_store touches)."""
    p = dht_bounds.GuardedDHTProtocol.__new__(dht_bounds.GuardedDHTProtocol)
    p.storage, p.cache = DHTLocalStorage(), DHTLocalStorage()  # become BoundedStorage, as in DHTProtocol.create
    p.record_validator = CompositeValidator(records.make_validators("mine"))
    p.node_info = dht_pb2.NodeInfo()
    return p


@pytest.mark.parametrize("shape", dht_flood.SHAPES[:3])
def test_a_4mib_store_request_is_refused_whole_and_counted(shape) -> None:
    """The largest StoreRequest hivemind's 4 MiB message cap lets through (~80k-140k records) is refused
    before any record is validated or stored."""
    records.REFUSALS.clear()
    p = _protocol()
    assert isinstance(p.storage, dht_bounds.BoundedStorage) and isinstance(p.cache, dht_bounds.BoundedStorage)
    req = dht_flood.store_request(shape)
    resp = asyncio.run(p.rpc_store(req, _Ctx()))
    assert list(resp.store_ok) == [False] * len(req.keys)
    assert records.REFUSALS == {"store_too_large": 1}
    assert len(p.storage) == 0


def test_a_store_request_within_bounds_is_stored_in_paced_chunks() -> None:
    """The most a request may carry (4 dictionaries of 1,024 subkeys) is stored, yielding to the event loop
    every STORE_CHUNK records, so the child's other RPCs wait for one chunk, not the whole request."""
    records.REFUSALS.clear()
    p = _protocol()
    req = dht_flood.store_request("within_bounds")
    turns = []

    async def run():
        async def other_rpcs():
            while True:
                turns.append(1)
                await asyncio.sleep(0)

        bystander = asyncio.create_task(other_rpcs())
        await asyncio.sleep(0)
        resp = await p.rpc_store(req, _Ctx())
        bystander.cancel()
        return resp

    resp = asyncio.run(run())
    assert list(resp.store_ok) == [True] * 4
    assert p.storage.counted == 4 * 1024 == sum(len(v.value) for _k, v in p.storage.items())
    assert len(turns) >= 2 * 4 * 1024 // dht_bounds.STORE_CHUNK  # validation and storing both paced
    assert records.REFUSALS == {}


def test_refusal_tally_survives_a_child_restart() -> None:
    t = RefusalTally()
    assert t.new_since_last({"record_shape": 3}) == {"record_shape": 3}
    assert t.new_since_last({"record_shape": 5}) == {"record_shape": 2}
    assert t.new_since_last({"record_shape": 1}) == {"record_shape": 1}  # restarted child counts from 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_attackers_dht_cannot_bloat_or_poison_a_nodes_storage(tmp_path) -> None:
    """A hivemind DHT without validators joins a SwarmPeer and floods it; its DHT child refuses and counts."""
    cfg = SwarmConfig(enabled=True, swarm_id="mine", host_maddrs=["/ip4/127.0.0.1/tcp/0"], heartbeat_s=1.0,
                      record_ttl_s=30.0, bootstrap_retries=1, bootstrap_timeout_s=5.0)
    node = SwarmPeer(cfg, PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x"), validate=None).start()
    key, sub, pid = _identity(tmp_path, "attacker")
    attacker = hivemind.DHT(initial_peers=node.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True,
                            record_validators=[RSASignatureValidator(key)])
    try:
        exp = get_dht_time() + 60
        flood = [attacker.store("other_members", {"n": i}, exp, subkey=f"sybil{i}".encode(), return_future=True)
                 for i in range(dht_bounds.MAX_SUBKEYS_PER_KEY + 50)]
        for f in flood:
            f.result(60)
        attacker.store("other_members", {"junk": "x" * 50}, exp, subkey=sub)  # signed, wrong shape
        attacker.store("other_batch", {"x": b"y" * (records.MAX_RECORD_BYTES + 10)}, exp, subkey=b"s")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            refused = node.stats()["rejected"]
            if refused.get("subkeys_full", 0) >= 50 and refused.get("record_shape") and refused.get("record_too_large"):
                break
            time.sleep(0.5)
        totals = record_refusals(node.dht.child)
        assert totals["subkeys_full"] >= 50
        assert totals["record_shape"] >= 1 and totals["record_too_large"] >= 1
        assert refused.get("subkeys_full", 0) >= 50  # reached the node's rejection counters (metrics)
        # the node's own swarm keeps working
        assert [m.peer_id for m in node.live_peers()] == [node.peer_id]
    finally:
        attacker.shutdown()
        node.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_nodes_dht_answers_finds_while_flooded_with_4mib_store_requests() -> None:
    """Before: one 4 MiB StoreRequest (~110k one-byte records) held a node's DHT child for minutes; every
    find timed out. Now a real hivemind peer sends such requests back to back for 10 s and the child answers
    every find of another peer meanwhile, and counts each refused request."""
    cfg = SwarmConfig(enabled=True, swarm_id="mine", host_maddrs=["/ip4/127.0.0.1/tcp/0"], heartbeat_s=1.0,
                      record_ttl_s=30.0, bootstrap_retries=1, bootstrap_timeout_s=5.0)
    node = SwarmPeer(cfg, PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x"), validate=None).start()
    flooder = probe = None
    try:
        probe = dht_flood.FindProbe(node.visible_maddrs())
        flooder = dht_flood.Flooder(node.visible_maddrs(), "plain", concurrency=2)
        flooder.start(duration_s=10.0)
        latencies = probe.probe(10.0, period_s=0.25, timeout_s=10.0)
        counts = flooder.join(120)
        assert max(latencies) < 10.0, dht_flood.summary(latencies)  # every find answered (timeout: 10 s)
        assert counts["answered"] >= 2 and counts["refused_records"] == counts["answered"] * flooder.records
        deadline = time.monotonic() + 10
        while node.stats()["rejected"].get("store_too_large", 0) < counts["answered"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert node.stats()["rejected"]["store_too_large"] >= counts["answered"]
        print(f"\nfinds while flooded: {dht_flood.summary(latencies)}; {counts}")
    finally:
        for peer in (flooder, probe):
            if peer is not None:
                peer.stop()
        node.close()


async def _never_answers(_dht, _node) -> None:
    import asyncio

    await asyncio.sleep(3600)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_call_pending_when_the_dht_child_dies_ends_at_once() -> None:
    """A crashed DHT child (docs/security.md, "kill the DHT"): a call waiting on a SIGKILLed child used to block its thread (the heartbeat) for the full
    10 s call timeout before the death was noticed; now it fails with ConnectionError as soon as the child is gone."""
    import os
    import signal
    import threading

    cfg = SwarmConfig(enabled=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], heartbeat_s=1.0, record_ttl_s=30.0,
                      bootstrap_retries=1, bootstrap_timeout_s=5.0)
    node = SwarmPeer(cfg, PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x"), validate=None).start()
    outcome: dict = {}

    def call() -> None:
        t0 = time.monotonic()
        try:
            node.dht.call("run_coroutine", _never_answers)
        except Exception as exc:
            outcome["error"] = type(exc)
        outcome["s"] = time.monotonic() - t0

    try:
        caller = threading.Thread(target=call)
        caller.start()
        time.sleep(0.5)
        os.kill(node.dht.child.pid, signal.SIGKILL)
        caller.join(30)
        assert outcome["error"] is ConnectionError  # not TimeoutError after supervisor.CALL_TIMEOUT_S
        deadline = time.monotonic() + 30
        while node.stats()["dht_restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node.stats()["dht_restarts"] == 1
        print(f"\npending call ended {outcome['s'] - 0.5:.2f}s after the kill")
    finally:
        node.close()
