"""The asynchronous exchange's receive side, without a network: freshness rules and the bounded buffer."""

from __future__ import annotations

import random

import pytest

from swarm_node.swarm.intake import Freshness, Intake, Offer

SHA = "0" * 64


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _offer(peer: str, round_: int, *, version: int | None = None, generated: float, size: int = 10) -> Offer:
    return Offer(peer, round_, round_ - 1 if version is None else version, generated, size, SHA, {})


def _intake(clock, **kw) -> Intake:
    limits = kw.pop("limits", Freshness(max_age_s=60, max_version_lag=8, max_clock_skew_s=5, max_version_jump=100))
    return Intake(limits, max_batches=kw.pop("max_batches", 8), max_bytes=kw.pop("max_bytes", 10_000),
                  clock=clock, rng=random.Random(0), **kw)


def _deliver(intake: Intake, offer: Offer, payload: bytes = b"x" * 10) -> str:
    verdict, to_fetch = intake.offer(offer)
    if to_fetch is not None:
        intake.fetched(to_fetch, payload)
    return verdict


def test_future_and_impossible_offers_are_refused_and_counted():
    clock = Clock()
    intake = _intake(clock)
    now = clock.t
    assert _deliver(intake, _offer("a", 1, generated=now + 60)) == "future_time"
    assert _deliver(intake, _offer("a", 1, generated=float("nan"))) == "bad_time"
    assert _deliver(intake, _offer("a", 1, generated=-5.0)) == "bad_time"
    assert _deliver(intake, _offer("a", 1, version=5, generated=now)) == "bad_version"
    assert _deliver(intake, _offer("a", 10**12, generated=now)) == "future_round"  # docs/security.md: rounds from the future
    assert intake.counts["future_time"] == 1 and intake.counts["bad_time"] == 2
    assert intake.counts["future_round"] == 1 and intake.snapshot()["buffered_batches"] == 0
    # small skew is tolerated; a signed heartbeat at round 5000 makes round 5050 plausible
    assert _deliver(intake, _offer("a", 3, generated=now + 4)) == "fetch"
    intake.note_member("b", 5000)
    assert _deliver(intake, _offer("b", 5050, generated=now)) == "fetch"
    assert _deliver(intake, _offer("b", 5050 + 101, generated=now)) == "future_round"


def test_future_rounds_never_grow_per_peer_state():
    clock = Clock()
    intake = _intake(clock, max_peers=16)
    for i in range(1000):
        _deliver(intake, _offer(f"p{i}", 10**12 + i, generated=clock.t))
    assert intake.snapshot()["peers"] == 0  # refused before any state is kept
    for i in range(1000):
        _deliver(intake, _offer(f"p{i}", 1, generated=clock.t))
    assert intake.snapshot()["peers"] == 16  # least recently heard peers are dropped
    assert intake.snapshot()["buffered_batches"] <= 8


def test_stale_batches_are_never_taken():
    clock = Clock()
    intake = _intake(clock)
    assert _deliver(intake, _offer("a", 1, generated=clock.t - 61)) == "stale_age"  # refused on arrival
    assert _deliver(intake, _offer("a", 2, generated=clock.t)) == "fetch"
    clock.t += 61  # ages in the buffer past the limit
    taken, _ = intake.take(4)
    assert taken == [] and intake.counts["stale_age"] == 2


def test_version_lag_counts_the_senders_own_versions():
    clock = Clock()
    intake = _intake(clock)
    _deliver(intake, _offer("a", 5, generated=clock.t))
    # 'a' moves on 8 versions: still within the lag limit; what we hold stays buffered
    assert intake.offer(_offer("a", 13, generated=clock.t))[0] == "pending"
    taken, refetch = intake.take(4)
    assert [t.offer.round for t in taken] == [5] and intake.ages(taken)[0][1] == 8
    assert [o.round for o in refetch] == [13]  # the slot freed: the newest offer is fetched next
    intake.fetched(refetch[0], b"y" * 10)
    # 'a' moves 9 more versions: the buffered batch would be too far behind, so it is replaced
    verdict, to_fetch = intake.offer(_offer("a", 22, generated=clock.t))
    assert verdict == "fetch" and to_fetch.round == 22 and intake.counts["superseded"] == 1


def test_replays_are_duplicates_and_take_is_one_per_peer_up_to_k():
    clock = Clock()
    intake = _intake(clock)
    for peer in "abc":
        _deliver(intake, _offer(peer, 3, generated=clock.t))
    assert intake.offer(_offer("a", 3, generated=clock.t))[0] == "duplicate"
    assert intake.offer(_offer("a", 2, generated=clock.t))[0] == "duplicate"
    taken, _ = intake.take(2)
    assert len(taken) == 2 and len({t.offer.peer_id for t in taken}) == 2
    taken2, _ = intake.take(2)
    assert len(taken2) == 1  # what was not taken stays for the next round
    assert intake.take(2)[0] == []  # nothing arrived since: no batches, no waiting


def test_buffer_is_bounded_by_batches_and_bytes_and_counts_evictions():
    clock = Clock()
    intake = _intake(clock, max_batches=3, max_bytes=250)
    for i in range(5):
        clock.t += 1
        _deliver(intake, _offer(f"p{i}", 1, generated=clock.t), b"z" * 100)
    snap = intake.snapshot()
    assert snap["buffered_batches"] == 2 and snap["buffered_bytes"] == 200  # bytes bind before batches
    assert intake.counts["evicted"] == 3
    taken, _ = intake.take(8)
    assert sorted(t.offer.peer_id for t in taken) == ["p3", "p4"]  # the oldest arrivals went first


def test_declined_batches_stay_buffered():
    clock = Clock()
    intake = _intake(clock)
    _deliver(intake, _offer("a", 1, generated=clock.t))
    assert intake.take(2, lambda o: False)[0] == [] and intake.counts["declined"] == 1
    assert len(intake.take(2, lambda o: True)[0]) == 1


def test_lockstep_min_round_keeps_older_batches():
    clock = Clock()
    intake = _intake(clock)
    _deliver(intake, _offer("a", 3, generated=clock.t))
    assert intake.count_ready(min_round=4) == 0 and intake.take(2, min_round=4)[0] == []
    assert intake.count_ready(min_round=3) == 1


# ---- the same rules through real pushes between two SwarmPeers on 127.0.0.1 ----


def _wait(pred, timeout=30.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_pushed_batches_future_and_stale_refused_fresh_taken():
    import os
    import time

    from swarm_node.config import SwarmConfig
    from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw

    info = PeerInfo(mode="grpo", model_name="m", tokenizer_fp="tok", task_id="t")
    base = dict(enabled=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], heartbeat_s=1.0, bootstrap_retries=1)
    a = SwarmPeer(SwarmConfig(**base), info, validate=keep_raw).start()
    b = SwarmPeer(SwarmConfig(**base, initial_peers=a.visible_maddrs()), info, validate=keep_raw).start()
    try:
        assert _wait(lambda: b.peer_id in a.view)  # a reads membership at its heartbeat
        a.publish("batch", 10**12, os.urandom(500))  # a round from the future (docs/security.md)
        assert _wait(lambda: b.stats()["rejected"].get("future_round", 0) >= 1), b.stats()
        a.publish("batch", 5, os.urandom(500), generated=time.time() - 1000)  # older than the 120 s limit
        assert _wait(lambda: b.stats()["rejected"].get("stale_age", 0) >= 1), b.stats()
        payload = os.urandom(800)
        a.publish("batch", 6, payload)
        assert _wait(lambda: b.intake.count_ready() == 1)
        got = b.receive(4)
        assert [(r.peer_id, r.round, r.version, r.payload) for r in got.batches] == [(a.peer_id, 6, 5, payload)]
        assert 0 <= got.batches[0].age_s < 30 and got.batches[0].version_lag == 0
        assert got.payload_bytes_in == 800 and got.control_bytes_in > 0
        assert got.rejected.get("future_round", 0) >= 1 and got.rejected.get("stale_age", 0) >= 1  # (heartbeats re-push)
        assert b.receive(4).batches == []  # nothing new: an empty round, at once
        assert b.intake.snapshot()["peers"] == 1  # the future round left no state behind
    finally:
        b.close()
        a.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_batches_are_decoded_off_the_round_loop():
    """A payload that takes long to decode holds the decode thread, not the round: receive() returns (empty)
    while the decode is still running, the batch is taken decoded once it is done, and a payload the
    validator refuses is counted by its reason and never buffered."""
    import os
    import threading

    from swarm_node.config import SwarmConfig
    from swarm_node.swarm import PayloadRefused, PeerInfo, SwarmPeer

    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    threads = []

    def slow_validator(payload: bytes, offer):
        threads.append(threading.current_thread().name)
        if payload.startswith(b"bad"):
            raise PayloadRefused("protocol:schema", "not a batch")
        if payload.startswith(b"oops"):
            raise KeyError("a validator bug")
        started.set()
        release.wait(60)  # a decode that takes as long as the test wants
        finished.set()
        return {"round": offer.round, "n": len(payload)}

    info = PeerInfo(mode="grpo", model_name="m", tokenizer_fp="tok", task_id="t")
    base = dict(enabled=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"], heartbeat_s=1.0, bootstrap_retries=1)
    a = SwarmPeer(SwarmConfig(**base), info, validate=None).start()  # publishes only
    b = SwarmPeer(SwarmConfig(**base, initial_peers=a.visible_maddrs()), info, validate=slow_validator).start()
    try:
        assert _wait(lambda: b.peer_id in a.view)
        a.publish("batch", 3, os.urandom(700))
        assert started.wait(30), b.stats()
        got = b.receive(4)  # the round goes on while the batch is being decoded
        assert got.batches == [] and not finished.is_set()
        assert b.intake.count_ready() == 0  # nothing unvalidated is ever buffered
        release.set()
        assert _wait(lambda: b.intake.count_ready() == 1)
        got = b.receive(4)
        assert [(r.round, r.decoded) for r in got.batches] == [(3, {"round": 3, "n": 700})]
        assert threads and all(t.startswith("swarm-node-decode") for t in threads)  # not the caller's thread
        a.publish("batch", 4, b"bad" + os.urandom(100))
        assert _wait(lambda: b.stats()["payload_refused"].get("protocol:schema", 0) >= 1), b.stats()
        got = b.receive(4)
        assert got.batches == [] and got.payload_refused == {"protocol:schema": 1}
        assert b.intake.count_ready() == 0
        a.publish("batch", 5, b"oops" + os.urandom(100))  # a validator that raises refuses, the node goes on
        assert _wait(lambda: b.stats()["rejected"].get("validate_error", 0) >= 1), b.stats()
        got = b.receive(4)
        assert got.batches == [] and got.rejected == {"validate_error": 1} and got.payload_refused == {}
    finally:
        release.set()
        b.close()
        a.close()
