"""The swarm peer's parts without a network: refusal logs are rate-limited, every reason is registered."""

from __future__ import annotations

import ast
import logging
import time
import types
from pathlib import Path

import pytest

from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw, reasons
from swarm_node.swarm.announce import BatchAnnouncement
from swarm_node.swarm.counters import SwarmCounters

SWARM_DIR = Path(__file__).resolve().parents[1] / "swarm_node" / "swarm"
INFO = PeerInfo(mode="grpo", model_name="m", tokenizer_fp="tok", task_id="t")


def _announcement(round_: int, **kw) -> BatchAnnouncement:
    fields = dict(kind="batch", round=round_, version=0, generated=time.time(), size=100, sha256="0" * 64,
                  mode="grpo", model_name="x", tokenizer_fp="tok", task_id="t")
    return BatchAnnouncement(**{**fields, **kw})


def _peer_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "rejected from peer" in r.getMessage()]


def test_a_thousand_refused_announcements_write_a_bounded_number_of_lines(caplog) -> None:
    """Refused pushed announcements are counted one by one, but logged through the rate limiter: a peer
    (or a thousand fresh identities) cannot write a WARNING per message it sends."""
    node = SwarmPeer(SwarmConfig(enabled=True), INFO, validate=keep_raw)  # never started: no network
    on_announcement = node.receiver.on_announcement
    with caplog.at_level(logging.WARNING, logger="swarm_node.swarm"):
        for i in range(1000):  # one peer, rounds far in the future
            on_announcement("flooder", _announcement(10**12 + i), "", 400)
        for i in range(1000):  # a thousand identities, each with one batch generated an hour ago
            on_announcement(f"sybil-{i}", _announcement(1, generated=time.time() - 3600), "", 400)
        for _ in range(1000):  # messages that are not announcements at all
            on_announcement("junk", None, "not JSON", 40)
    rejected = node.stats()["rejected"]
    assert rejected["future_round"] == 1000 and rejected["stale_age"] == 1000
    assert rejected["bad_announcement"] == 1000  # each one counted, not only the first of a peer
    lines = _peer_lines(caplog)
    burst = node.counters.peer_log.burst
    assert 3 <= len(lines) <= 3 * burst, len(lines)  # one burst per reason, for 3,000 refusals
    assert node.counters.peer_log.suppressed_total == 3000 - len(lines)


def test_counters_refuse_a_reason_outside_the_registry() -> None:
    counters = SwarmCounters(logging.getLogger("test"))
    counters.reject(reasons.DIGEST_MISMATCH, "p", "x")
    with pytest.raises(ValueError, match="not a reason"):
        counters.reject("made_up_reason", "p", "x")


def test_the_registry_covers_every_family_of_reasons() -> None:
    from swarm_node.swarm import records, transfer

    assert set(transfer.UPLOAD_REASONS) | set(reasons.TRANSFER_REASONS) | set(reasons.OFFER_REASONS) <= set(
        reasons.REJECTED)
    assert set(reasons.RECORD_REASONS) <= set(reasons.REJECTED) and reasons.VALIDATE_ERROR in reasons.REJECTED
    assert not set(reasons.EVENTS) & set(reasons.REJECTED)
    assert len(set(reasons.REJECTED)) == len(reasons.REJECTED)
    assert records.REFUSALS is not None  # the DHT child's counter, keyed by RECORD_REASONS


REASON_CALLS = {"reject", "log_refusal", "TransferError", "BadRequest", "_refuse", "refuse"}


def test_no_swarm_module_names_a_reason_by_a_string_literal() -> None:
    """Every reason the swarm counts is a constant of swarm/reasons.py: a literal passed where a reason goes
    (or a `reasons.X` that does not exist) would slip past the registry the node side exports."""
    bad = []
    for path in sorted(SWARM_DIR.glob("*.py")):
        if path.name == "reasons.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                if name in REASON_CALLS and isinstance(node.args[0], ast.Constant):
                    bad.append(f"{path.name}:{node.lineno} {name}({node.args[0].value!r})")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "reasons"
                    and not hasattr(reasons, node.attr)):
                bad.append(f"{path.name}:{node.lineno} reasons.{node.attr}")
    assert bad == []


def test_a_node_alone_in_its_member_reads_pings_the_peers_it_knows() -> None:
    """After ALONE_READS member reads that list no peer but us (an outage emptied the DHT routing table),
    the heartbeat pings the known peers, then at most every REJOIN_EVERY_S while still alone; one read that
    lists a peer stops it. (The real outage, through SwarmPeer's heartbeat: tests/test_net_scenarios.py, the
    link cut.)"""
    from swarm_node.swarm.rejoin import ALONE_READS, REJOIN_EVERY_S, RejoinPolicy

    policy, t = RejoinPolicy(), 1000.0
    assert SwarmPeer(SwarmConfig(enabled=True), INFO, validate=keep_raw).rejoin_policy.after_reads == ALONE_READS
    for _ in range(ALONE_READS - 1):
        policy.read(others_listed=False)
        assert not policy.due(t)  # not yet: a peer may simply not have stored its record
    policy.read(others_listed=False)
    assert policy.due(t)
    policy.read(others_listed=False)
    assert not policy.due(t + REJOIN_EVERY_S / 2)  # rate-limited
    policy.read(others_listed=False)
    assert policy.due(t + REJOIN_EVERY_S)
    policy.read(others_listed=True)  # a read lists a peer again: back to normal
    assert not policy.due(t + 10 * REJOIN_EVERY_S) and policy.alone_reads == 0
    policy.read(others_listed=False)
    assert not policy.due(t + 20 * REJOIN_EVERY_S)  # and the count starts again


class _Writer:
    """What the blob handler writes to, without a stream."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data) -> None:
        self.data += bytes(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_serving_a_blob_hashes_nothing_on_the_event_loop(monkeypatch) -> None:
    """Before: the upload handler hashed the whole blob (up to max_batch_bytes) on the event loop for every
    request, though its digest was computed when it was published. Now it sends the stored digest."""
    import asyncio
    import hashlib
    import json

    from swarm_node.swarm import transfer
    from swarm_node.swarm.blobs import describe

    node = SwarmPeer(SwarmConfig(enabled=True), INFO, validate=keep_raw)  # not started: its parts only
    payload = b"p" * (3 << 20)
    node.blobs.put("batch", describe(7, payload), payload)
    hashed = []

    class CountingHashlib:
        @staticmethod
        def sha256(data=b""):
            hashed.append(len(data))
            return hashlib.sha256(data)

    monkeypatch.setattr(transfer, "hashlib", CountingHashlib)
    handler = node.dht.handlers[transfer.HANDLER]
    req = json.dumps({"kind": "batch", "round": 7}).encode()

    async def serve() -> bytes:
        reader, writer = asyncio.StreamReader(), _Writer()
        reader.feed_data(len(req).to_bytes(2, "big") + req)
        reader.feed_eof()
        await handler(types.SimpleNamespace(peer_id="requester"), reader, writer)
        return bytes(writer.data)

    for _ in range(3):
        sent = asyncio.run(serve())
        assert sent[:1] == transfer.FOUND and int.from_bytes(sent[1:9], "big") == len(payload)
        assert sent[9:41] == hashlib.sha256(payload).digest() and sent[41:] == payload
    assert hashed == []
    assert node.stats()["served"] == 3


def test_the_peers_skipped_as_unreachable_are_pruned_and_bounded(monkeypatch) -> None:
    """Before: a peer whose push failed stayed in PeerView._unreachable forever (its skip long over, the peer
    long forgotten), so fresh identities that pushed to us and went away grew it without bound. Now a
    member read drops skips that are over and peers forgotten, and failures keep at most MAX_VIEW."""
    import asyncio

    from swarm_node.swarm import view as view_module
    from swarm_node.swarm.loop import LoopThread

    cfg = SwarmConfig(enabled=True, heartbeat_s=0.05)
    v = view_module.PeerView(cfg, "grpo", None, lambda: None, LoopThread(), SwarmCounters(logging.getLogger("t")),
                             logging.getLogger("t"))

    async def fail_pushes(pids) -> None:
        for pid in pids:
            await v._push_one(pid, b"frame")  # no P2P: every push fails

    asyncio.run(fail_pushes([f"gone{i}" for i in range(20)]))
    assert len(v._unreachable) == 20
    time.sleep(0.1)  # their skips are over
    v.update({}, set())
    assert v._unreachable == {}
    monkeypatch.setattr(view_module, "MAX_VIEW", 8)
    asyncio.run(fail_pushes([f"sybil{i}" for i in range(100)]))
    assert list(v._unreachable) == [f"sybil{i}" for i in range(92, 100)]


def test_a_batch_offer_over_the_batch_cap_is_refused_before_any_download() -> None:
    """A GRPO node passes the largest payload a valid batch can be (`batch_cap`); an offer over it is refused
    as too_large without a download, while DPO's parameters keep their own cap (`params_cap`)."""
    import asyncio

    from swarm_node.swarm.records import BlobEntry

    node = SwarmPeer(SwarmConfig(enabled=True), INFO, validate=keep_raw, batch_cap=10_000)
    spawned = []
    node.loop.spawn = spawned.append
    node.receiver.on_announcement("peer", _announcement(1, size=10_001, model_name="m"), "", 400)
    assert node.stats()["rejected"] == {"too_large": 1} and spawned == []
    node.receiver.on_announcement("peer", _announcement(2, size=10_000, model_name="m"), "", 400)
    assert len(spawned) == 1
    spawned[0].close()
    entry = BlobEntry(round=3, size=10_001, sha256="0" * 64)
    _payload, reason = asyncio.run(node.receiver._download("params", "peer", entry, 1.0))
    assert reason == "stream_error"  # not too_large: no P2P here, so the download itself fails


def test_dpo_parameters_are_bounded_by_their_own_setting_not_the_batch_cap() -> None:
    """A DPO peer's `params_cap` (dpo.max_payload_bytes) bounds the parameters it fetches and publishes,
    below or above swarm.max_batch_bytes; batches keep swarm.max_batch_bytes."""
    import asyncio

    from swarm_node.config import DPOConfig
    from swarm_node.swarm.records import BlobEntry

    assert DPOConfig().max_payload_bytes == SwarmConfig().max_batch_bytes  # the same default bound as before
    cfg = SwarmConfig(enabled=True, max_batch_bytes=1 << 20)
    small = SwarmPeer(cfg, INFO, validate=None, params_cap=10_000)
    _payload, reason = asyncio.run(small.receiver._download("params", "peer", BlobEntry(round=3, size=10_001, sha256="0" * 64), 1.0))
    assert reason == "too_large" and small.stats()["rejected"] == {"too_large": 1}
    with pytest.raises(ValueError, match="dpo.max_payload_bytes=10000"):
        small.publish("params", 3, b"x" * 10_001)
    large = SwarmPeer(cfg, INFO, validate=None, params_cap=4 << 20)
    _payload, reason = asyncio.run(large.receiver._download("params", "peer", BlobEntry(round=3, size=2 << 20, sha256="0" * 64), 1.0))
    assert reason == "stream_error"  # over max_batch_bytes, under its own cap: it would be downloaded
    with pytest.raises(ValueError, match="swarm.max_batch_bytes"):
        large.publish("batch", 3, b"x" * ((1 << 20) + 1))


def test_download_slots_serve_trusted_peers_first_and_cap_strangers() -> None:
    """Before: a FIFO semaphore of 4, so stallers that announced first held every slot ahead of an
    established peer. Now strangers hold at most their share, and a freed slot goes to the best rank."""
    import asyncio

    from swarm_node.swarm.slots import DownloadSlots

    async def run() -> list[str]:
        slots = DownloadSlots(total=4, stranger_slots=2)
        order: list[str] = []

        async def download(name: str, rank: int, hold: asyncio.Event) -> None:
            await slots.acquire((rank, 0), stranger=rank > 0)
            order.append(name)
            await hold.wait()
            slots.release(stranger=rank > 0)

        holds = {f"s{i}": asyncio.Event() for i in range(6)} | {"e0": asyncio.Event(), "e1": asyncio.Event(),
                                                                 "e2": asyncio.Event()}
        tasks = [asyncio.create_task(download(f"s{i}", 1, holds[f"s{i}"])) for i in range(6)]
        await asyncio.sleep(0)
        assert order == ["s0", "s1"] and slots.held == 2  # strangers' share: 2 of 4, the rest waits
        tasks += [asyncio.create_task(download(f"e{i}", 0, holds[f"e{i}"])) for i in range(3)]
        await asyncio.sleep(0)
        assert order == ["s0", "s1", "e0", "e1"]  # established peers take the free slots at once
        holds["s0"].set()  # a stranger's slot frees: the waiting established peer goes first
        await asyncio.sleep(0.01)
        assert order[-1] == "e2" and slots.held == 4
        holds["e0"].set()  # an established peer's slot frees: a stranger may take it again (1 of 2 held)
        await asyncio.sleep(0.01)
        assert order[-1] == "s2" and slots.strangers_held == 2
        waiting = asyncio.create_task(download("s9", 1, asyncio.Event()))
        await asyncio.sleep(0)
        waiting.cancel()  # a cancelled wait holds nothing
        for e in holds.values():
            e.set()
        await asyncio.gather(*tasks)
        assert slots.held == 0 and slots.strangers_held == 0 and slots.waiting() == 0
        return order

    order = asyncio.run(run())
    assert sorted(order) == sorted(["s0", "s1", "s2", "s3", "s4", "s5", "e0", "e1", "e2"])


def test_pushes_go_to_trusted_peers_first_with_one_place_for_strangers() -> None:
    """Anyone who pushes to us joins the view; 64 identities that only announce took ~60 of every 64 pushes
    of an honest node, so its established peer heard of its batches only now and then. With a rank, the
    trusted peers fill all but one of the F places; strangers (newcomers) keep the last one."""
    from swarm_node.swarm.loop import LoopThread
    from swarm_node.swarm.records import MemberRecord
    from swarm_node.swarm.view import PeerView

    def member(pid: str) -> MemberRecord:
        return MemberRecord(peer_id=pid, mode="grpo", model_name="m", tokenizer_fp="tok", task_id="t", round=1,
                            updated=time.time())

    trusted = {"honest0", "honest1"}
    v = PeerView(SwarmConfig(enabled=True), "grpo", None, lambda: None, LoopThread(),
                 SwarmCounters(logging.getLogger("t")), logging.getLogger("t"),
                 rank=lambda pid: 0 if pid in trusted else 1)
    for pid in [f"staller{i}" for i in range(64)] + sorted(trusted):
        v.heard_from(pid, member(pid))
    for _ in range(50):
        picked = v.targets(4)
        assert trusted <= set(picked) and len(picked) == 4  # both trusted peers, and two strangers
    trusted |= {f"honest{i}" for i in range(2, 8)}
    for pid in sorted(trusted):
        v.heard_from(pid, member(pid))
    picked = [v.targets(4) for _ in range(50)]
    assert all(sum(p in trusted for p in ps) == 3 for ps in picked)  # one place left for a newcomer
    assert len(v.targets(100)) == 72  # a greeting round still reaches everyone


def test_a_member_read_while_the_dht_is_down_answers_with_the_last_one(monkeypatch, tmp_path) -> None:
    """Before: a read that failed (our DHT child dead or restarting) answered "nobody", so a DPO node averaged
    with no neighbour and ran its rounds alone, ahead of its neighbours, until the round they next asked it
    for was one it no longer kept (4 of 10 DHT kills lost a round at both neighbours). Now a failed read
    answers with the last read that worked, for a record TTL; a read that works and finds nobody is nobody."""
    from hivemind.p2p import P2P

    from swarm_node.swarm import records
    from swarm_node.swarm.supervisor import DHTUnavailable

    P2P.generate_identity(str(tmp_path / "peer-a"))
    subkey = records.subkey_for(records.load_identity_key(str(tmp_path / "peer-a")))
    pid = records.peer_id_of_subkey(subkey)
    rec = dict(peer_id=pid, mode="dpo", model_name="m", tokenizer_fp="tok", task_id="t", round=3,
               updated=time.time(), arch_fp="", client_mode=False, level=0)
    node = SwarmPeer(SwarmConfig(enabled=True, record_ttl_s=20.0, membership="full"), INFO,
                     validate=keep_raw)  # never started
    node.dht.peer_id = "me"
    dht = {"value": {subkey: types.SimpleNamespace(value=rec)}, "down": False}

    def call(method, key, **kw):  # the DHT child's get, or the error a call raises while it restarts
        if dht["down"]:
            raise DHTUnavailable("the DHT is restarting")
        return types.SimpleNamespace(value=dht["value"])

    monkeypatch.setattr(node.dht, "call", call)
    assert set(node.membership.read_members()) == {pid}
    dht["down"] = True
    assert set(node.membership.read_members()) == {pid}
    assert [m.peer_id for m in node.live_peers()] == sorted(["me", pid])
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 21.0)  # a TTL later the records may have expired
    assert node.membership.read_members() == {}
    dht["down"], dht["value"] = False, {}
    assert node.membership.read_members() == {}


# ---- sampled membership (swarm.membership: sampled) ----


def test_auto_membership_is_sampled_for_grpo_and_full_for_dpo() -> None:
    from swarm_node.swarm.membership import Membership
    from swarm_node.swarm.shards import ShardedMembership, membership_kind

    assert membership_kind("auto", "grpo") == "sampled" and membership_kind("auto", "dpo") == "full"
    assert membership_kind("full", "grpo") == "full" and membership_kind("sampled", "dpo") == "sampled"
    assert isinstance(SwarmPeer(SwarmConfig(enabled=True), INFO, validate=keep_raw).membership, ShardedMembership)
    full = SwarmPeer(SwarmConfig(enabled=True, membership="full"), INFO, validate=keep_raw)
    assert isinstance(full.membership, Membership) and full.view.book is None


def _sampled_view(rank, ttl_s: float = 60.0):
    from swarm_node.swarm.loop import LoopThread
    from swarm_node.swarm.view import PeerView

    return PeerView(SwarmConfig(enabled=True, membership="sampled", record_ttl_s=ttl_s), "grpo", None, lambda: None,
                    LoopThread(), SwarmCounters(logging.getLogger("t")), logging.getLogger("t"), rank=rank,
                    sampled=True)


def _grpo_member(pid: str, updated: float | None = None):
    from swarm_node.swarm.records import MemberRecord

    return MemberRecord(peer_id=pid, mode="grpo", model_name="m", tokenizer_fp="tok", task_id="t", round=1,
                        updated=time.time() if updated is None else updated)


def test_a_sampled_view_is_bounded_and_keeps_its_established_peers() -> None:
    """Full membership's view holds up to 4,096 peers; a sampled one VIEW_SIZE, and a flood of fresh
    identities (pushers or records read) evicts strangers only, never a peer the gate established; pushes
    go to established peers first."""
    from swarm_node.swarm.sampling import VIEW_SIZE

    established = {f"honest{i}" for i in range(4)}
    v = _sampled_view(lambda pid: 0 if pid in established else 2)
    for pid in sorted(established):
        v.heard_from(pid, _grpo_member(pid))
    for i in range(200):
        v.heard_from(f"sybil{i}", _grpo_member(f"sybil{i}"))
    assert len(v) <= VIEW_SIZE and len(v.book) == len(v)
    v.update({f"read{i}": _grpo_member(f"read{i}") for i in range(50)}, set())
    assert len(v) <= VIEW_SIZE and len(v.book) == len(v)
    assert established <= {m.peer_id for m in v.others()}
    for _ in range(20):
        assert established & set(v.targets(4))


def test_a_sampled_view_forgets_a_silent_peer_after_a_ttl_and_keeps_one_it_talks_with(monkeypatch) -> None:
    """Nothing is forgotten on a read any more: a peer leaves when its record is a TTL old and no push went
    either way within a TTL."""
    v = _sampled_view(lambda pid: 2, ttl_s=60.0)
    now = time.time()
    v.update({"silent": _grpo_member("silent", now), "talker": _grpo_member("talker", now)}, set())
    assert {m.peer_id for m in v.others()} == {"silent", "talker"}
    monkeypatch.setattr(time, "time", lambda: now + 50.0)
    v.heard_from("talker", _grpo_member("talker", now))  # it pushed to us (its record itself is old)
    assert v.update({}, set()) == []  # a read that lists nobody forgets nobody
    monkeypatch.setattr(time, "time", lambda: now + 90.0)
    assert v.update({}, set()) == ["silent"]
    assert {m.peer_id for m in v.others()} == {"talker"}


def test_a_sampled_node_without_contact_for_three_beats_pings_the_peers_it_knows() -> None:
    """A random shard may hold only us, so sampled mode asks for no read that lists a peer: it counts the
    heartbeats without any contact (a read that listed a peer, or a push that got through either way)."""
    node = SwarmPeer(SwarmConfig(enabled=True, membership="sampled"), INFO, validate=keep_raw)  # never started
    now = time.monotonic()
    for beat in range(1, 4):
        node._note_contact(now + beat)
    assert node.rejoin_policy.due(now + 3)
    node.view.last_contact = now + 3.5  # a push of ours got through
    node._note_contact(now + 4)
    assert not node.rejoin_policy.due(now + 100)
