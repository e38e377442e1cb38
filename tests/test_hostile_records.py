"""Hostile DHT records (docs/security.md: junk under other swarms' keys, bloated keys and storage).

Shapes are checked under every swarm's keys, sizes, lifetimes and subkeys per key bounded. Unit tests run the real hivemind validators on DHTRecords; the slow test floods
a real SwarmNode's DHT child from an attacker's hivemind DHT on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import hivemind
import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.p2p import P2P
from hivemind.utils.serializer import MSGPackSerializer as S
from hivemind.utils.timed_storage import get_dht_time

from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmNode, records
from swarm_node.swarm.dht import RefusalTally, record_refusals


def _identity(tmp_path: Path, name: str):
    path = tmp_path / name
    P2P.generate_identity(str(path))
    key = records.load_identity_key(str(path))
    return key, records.subkey_for(key), records.peer_id_of_subkey(records.subkey_for(key))


def _member(peer_id: str) -> dict:
    return dict(peer_id=peer_id, mode="grpo", model_name="m", tokenizer_fp="t", task_id="x", round=0,
                updated=time.time(), arch_fp="", client_mode=False)


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
    class Bounded(DHTLocalStorage):
        pass

    Bounded.store, Bounded.store_subkey = records.bounded_store_methods(max_subkeys=5, max_entries=11)
    records.REFUSALS.clear()
    st = Bounded()
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


def test_refusal_tally_survives_a_child_restart() -> None:
    t = RefusalTally()
    assert t.new_since_last({"record_shape": 3}) == {"record_shape": 3}
    assert t.new_since_last({"record_shape": 5}) == {"record_shape": 2}
    assert t.new_since_last({"record_shape": 1}) == {"record_shape": 1}  # restarted child counts from 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_attackers_dht_cannot_bloat_or_poison_a_nodes_storage(tmp_path) -> None:
    """A hivemind DHT without validators joins a SwarmNode and floods it; its DHT child refuses and counts."""
    cfg = SwarmConfig(enabled=True, swarm_id="mine", host_maddrs=["/ip4/127.0.0.1/tcp/0"], heartbeat_s=1.0,
                      record_ttl_s=30.0, bootstrap_retries=1, bootstrap_timeout_s=5.0)
    node = SwarmNode(cfg, PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x"), validate=None).start()
    key, sub, pid = _identity(tmp_path, "attacker")
    attacker = hivemind.DHT(initial_peers=node.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True,
                            record_validators=[RSASignatureValidator(key)])
    try:
        exp = get_dht_time() + 60
        flood = [attacker.store("other_members", {"n": i}, exp, subkey=f"sybil{i}".encode(), return_future=True)
                 for i in range(records.MAX_SUBKEYS_PER_KEY + 50)]
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
    node = SwarmNode(cfg, PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x"), validate=None).start()
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
