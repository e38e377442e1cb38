"""Identities that announce batches and never deliver them (tooling/stallers.py), against a real
SwarmPeer on 127.0.0.1 (docs/security.md, "Download slots").

Before: 4 download slots handed out first come, first served, each held up to collect_deadline_s (15 s),
and the newcomer gate acted only after a download; eight stalling identities delayed an honest batch by
30 s, a few dozen aged it out. Now a slot that frees goes to the peers the node ranks first (a GRPO node:
the identities its newcomer gate has established), strangers hold at most half the slots, and a download
is cut off after download_stall_s without a byte, or past download_stall_s + size / download_min_rate.
"""

from __future__ import annotations

import os
import time

import pytest

from swarm_node.swarm import SwarmPeer, keep_raw
from tests.test_swarm import INFO, _cfg
from tooling.stallers import Stallers


def _wait(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["silent", "trickle"])
def test_an_established_peers_batch_arrives_while_stallers_hold_the_queue(mode: str) -> None:
    """24 stalling identities announce first (silent: never answer; trickle: one byte a second); the
    established peer's batch, announced after them, is downloaded within seconds, and the stallers'
    downloads are cut off and counted."""
    receiver = SwarmPeer(_cfg(), INFO, validate=keep_raw,
                         rank=lambda pid: 0 if pid == honest_id[0] else 1).start()
    honest_id = [""]
    honest = SwarmPeer(_cfg(initial_peers=receiver.visible_maddrs()), INFO, validate=keep_raw).start()
    honest_id[0] = honest.peer_id
    stallers = Stallers(24, mode=mode)
    try:
        receiver.loop.run(stallers.start(receiver.visible_maddrs()), 120)
        pushed = receiver.loop.run(stallers.announce([receiver.peer_id], 1, mode="grpo", model_name="sybil",
                                                     tokenizer_fp="tok1", task_id="arithmetic"), 60)
        assert pushed == 24
        assert _wait(lambda: stallers.requests >= 2, 10)  # the stallers hold the strangers' slots
        t0 = time.monotonic()
        honest.publish("batch", 1, os.urandom(50_000))
        assert _wait(lambda: receiver.intake.count_ready(lambda o: o.peer_id == honest.peer_id) == 1, 30)
        arrived_s = time.monotonic() - t0
        got = receiver.receive(4).batches
        assert [b.peer_id for b in got] == [honest.peer_id]
        assert arrived_s < receiver.cfg.download_stall_s  # it waited for no staller's deadline
        # each stalled download is cut off, counted, not held for 15 s: silent ones after 5 s without a byte
        # (stalled), trickling ones at their deadline (5 s + 200 kB / 64 KiB/s ~ 8 s: timeout)
        reason = "stalled" if mode == "silent" else "timeout"
        assert _wait(lambda: receiver.stats()["rejected"].get(reason, 0) >= 4, 30)
        print(f"\n{mode}: honest batch downloaded {arrived_s:.2f}s after it was announced, behind 24 stallers; "
              f"stalled downloads cut off so far: {receiver.stats()['rejected'].get(reason, 0)}")
    finally:
        receiver.loop.run(stallers.close(), 60)
        honest.close()
        receiver.close()
