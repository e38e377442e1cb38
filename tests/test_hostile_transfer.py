"""Hostile requesters against the blob handler, over real hivemind P2P daemons on 127.0.0.1.

Junk requests and upload starvation (docs/security.md, "What a peer can do"): junk requests once raised
tracebacks and were not counted; requesters that ask for a blob and never read held every upload slot, so
honest fetches starved.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections import Counter

import pytest
from hivemind.p2p import P2P, PeerID

from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer
from swarm_node.swarm.ratelimit import RateLimitedLog
from swarm_node.swarm.transfer import (
    HANDLER,
    BadRequest,
    TransferError,
    UploadLimits,
    download,
    make_handler,
    parse_request,
    with_deadline,
)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]

JUNK = [b"[]", b"null", b"1", b'"a"', b"{}", b'{"kind": "batch"}', b'{"kind": "batch", "round": -1}',
        b'{"kind": "batch", "round": true}', b'{"kind": "batch", "round": 1.5}', b'{"kind": 7, "round": 0}',
        b'{"kind": "nope", "round": 0}', b'{"kind": "batch", "round": 0, "x": 1}', b"\xff\xfe", b"[" * 1000,
        b'{"kind": "batch", "round": 99999999999999999999999}', b"{" + b'"a":1,' * 100 + b'"b":2}']


# ---- request shapes, no network ----


@pytest.mark.parametrize("raw", JUNK)
def test_every_bad_request_shape_is_a_counted_reason(raw: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_request(raw, frozenset({"batch", "params"}))
    assert info.value.reason == "bad_request"


def test_good_request_parses() -> None:
    assert parse_request(b'{"kind": "batch", "round": 3}', frozenset({"batch"})) == ("batch", 3)


def test_rate_limited_log_holds_back_and_reports_the_count(caplog) -> None:
    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("t.ratelimit"), burst=3, period_s=30.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.ratelimit"):
        written = sum(rl.warning("bad_request", "junk %d", i) for i in range(100))
        assert written == 3 and rl.suppressed_total == 97
        assert rl.warning("other_reason", "another key has its own budget")
        now[0] += 10.0  # one token back (3 per 30 s)
        assert rl.warning("bad_request", "junk again")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5
    assert lines[-1] == "junk again [97 similar lines suppressed]"


# ---- real P2P ----


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _send_raw(client: P2P, peer: PeerID, frame: bytes) -> bytes:
    _info, reader, writer = await client.call_binary_stream_handler(peer, HANDLER)
    try:
        writer.write(frame)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_junk_requests_are_counted_without_tracebacks() -> None:
    """40 junk requests against a real SwarmPeer: each counted as bad_request, no traceback, few lines."""
    capture = _Capture()
    root = logging.getLogger()
    root.addHandler(capture)
    cfg = SwarmConfig(enabled=True, host_maddrs=LOOPBACK, heartbeat_s=1.0, record_ttl_s=30.0, bootstrap_retries=1,
                      bootstrap_timeout_s=5.0)
    node = SwarmPeer(cfg, PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x"), validate=None).start()

    async def attack() -> list[bytes]:
        client = await P2P.create(initial_peers=node.visible_maddrs(), host_maddrs=LOOPBACK)
        try:
            frames = [len(j).to_bytes(2, "big") + j for j in JUNK]
            frames += [b"\x00\x00", (5000).to_bytes(2, "big") + b"x" * 100]  # empty, and over MAX_REQUEST
            frames = (frames * 3)[:40]
            return [await _send_raw(client, PeerID.from_base58(node.peer_id), f) for f in frames]
        finally:
            await client.shutdown()

    try:
        answers = asyncio.run(attack())
        assert all(a == b"" for a in answers)  # refused: the stream is closed without serving anything
        deadline = time.monotonic() + 5
        while node.stats()["rejected"].get("bad_request", 0) < 40 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node.stats()["rejected"] == {"bad_request": 40}
    finally:
        node.close()
        root.removeHandler(capture)
    assert [r for r in capture.records if r.exc_info] == []
    peer_lines = [r for r in capture.records if "rejected from peer" in r.getMessage()]
    assert 1 <= len(peer_lines) <= 5  # rate-limited: 40 refusals, at most one burst of lines


async def _staller(client: P2P, peer: PeerID, n_streams: int) -> list:
    """Open streams, ask for the blob, never read: the writers stay open until the caller closes them."""
    held = []
    req = json.dumps({"kind": "batch", "round": 0}).encode()
    for _ in range(n_streams):
        _info, reader, writer = await client.call_binary_stream_handler(peer, HANDLER)
        writer.write(len(req).to_bytes(2, "big") + req)
        await writer.drain()
        held.append(writer)
    return held


async def _starvation_run(limits: UploadLimits, blob: bytes, honest_deadline_s: float) -> tuple[bytes | str, Counter]:
    refused: Counter = Counter()
    served: list[int] = []
    victim = await P2P.create(host_maddrs=LOOPBACK)
    digest = hashlib.sha256(blob).digest()
    handler = make_handler(lambda k, r: (blob, digest) if (k, r) == ("batch", 0) else None, served.append,
                           lambda reason, _peer, _detail: refused.update([reason]), limits=limits)
    await victim.add_binary_stream_handler(HANDLER, handler)
    maddrs = await victim.get_visible_maddrs()
    clients = [await P2P.create(initial_peers=maddrs, host_maddrs=LOOPBACK) for _ in range(4)]
    held = []
    try:
        # two identities fill every slot; a third opens 6 streams, over its per-peer share
        for client, n in zip(clients[:3], (2, 2, 6), strict=True):
            held += await _staller(client, victim.peer_id, n)
        await asyncio.sleep(1.0)
        try:
            got: bytes | str = await with_deadline(
                download(clients[3], victim.peer_id.to_base58(), "batch", 0, expected_size=len(blob),
                         expected_sha256=hashlib.sha256(blob).hexdigest(), max_bytes=len(blob),
                         on_received=lambda n: None),
                honest_deadline_s,
            )
        except TransferError as exc:
            got = exc.reason
        return got, refused
    finally:
        for w in held:
            w.close()
        for c in clients:
            await c.shutdown()
        await victim.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stallers_do_not_starve_an_honest_fetch() -> None:
    """Requesters that never read hold slots only until a write deadline; an honest 4 MiB fetch completes."""
    blob = os.urandom(4 << 20)  # far more than the socket and stream buffers between two p2pd daemons
    limits = UploadLimits(max_uploads=4, per_peer=2, write_timeout_s=2.0, slot_wait_s=20.0)
    got, refused = asyncio.run(_starvation_run(limits, blob, honest_deadline_s=25.0))
    assert got == blob
    assert refused["upload_busy"] >= 4  # the third staller's streams over its per-peer share
    assert refused["upload_timeout"] >= 4  # every slot holder was cut off at its write deadline
