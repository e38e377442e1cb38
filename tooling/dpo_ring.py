"""SwarmPeers that exchange parameters as DPO nodes do, and SIGKILLs of one node's DHT child (test tooling).

Each node runs rounds in a thread, as dpo/round.py does: publish `payload` bytes of "parameters" for
round r, read the live DPO peers (`live_peers`), fetch the same round from both of its neighbours on the
ring over the sorted live ids (in parallel, DEADLINE_S each), then `step_s` of local steps. The swarm
settings are the DPO demo's (peers/dpo-ring-*.yaml: heartbeat 2 s, record TTL 20 s, 20 s fetch deadline).
`kill_and_watch` SIGKILLs node 0's DHT child now and then and reports, per kill and ring neighbour, when
that neighbour held node 0's next round (the first it published after the kill). Used by
tests/test_faults.py and benchmarks/dht_recovery.py (`--exchange dpo`).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
DEADLINE_S = 20.0  # peers/dpo-ring-*.yaml: dpo.gossip_deadline_s
INFO = PeerInfo(mode="dpo", model_name="m", tokenizer_fp="t", task_id="x")


def _cfg(**kw) -> SwarmConfig:
    return SwarmConfig(enabled=True, host_maddrs=LOOPBACK, heartbeat_s=2.0, record_ttl_s=20.0, bootstrap_retries=1,
                       bootstrap_timeout_s=5.0, swarm_id="dpo-ring", **kw)


def ring_neighbours(ids: list[str], me: str) -> list[str]:
    """Both neighbours of `me` on the ring over the sorted ids (fewer when fewer peers are live)."""
    ids = sorted(set(ids) | {me})
    i = ids.index(me)
    return sorted({ids[(i - 1) % len(ids)], ids[(i + 1) % len(ids)]} - {me})


def kill_and_watch(n: int, kills: int, *, seed: int = 0, payload: int = 2_000_000, step_s: float = 0.3,
                   gap_s: tuple[float, float] = (2.0, 5.0)) -> list[dict]:
    """n nodes in DPO rounds; node 0's DHT child SIGKILLed `kills` times, gap_s apart. Per kill and ring
    neighbour of node 0: seconds from the kill until the neighbour held node 0's next round (`held_s`),
    whether it got it, the child's restart time and how long after the kill node 0 published that round."""
    nodes = [SwarmPeer(_cfg(), INFO, validate=None).start()]
    try:
        nodes += [SwarmPeer(_cfg(initial_peers=nodes[0].visible_maddrs()), INFO, validate=None).start()
                  for _ in range(n - 1)]
    except BaseException:
        for node in nodes:
            node.close()
        raise
    ids = {node.peer_id: i for i, node in enumerate(nodes)}
    published: dict[tuple[int, int], float] = {}  # (node, round) -> when it published it
    held: dict[tuple[int, int, int], tuple[float, bool]] = {}  # (fetcher, source, round) -> (when, got it)
    stop = threading.Event()
    pool = ThreadPoolExecutor(2 * n)

    def rounds(i: int) -> None:
        me, r = nodes[i], 0
        while not stop.is_set():
            published[(i, r)] = time.monotonic()
            me.publish("params", r, os.urandom(payload))
            me.set_round(r)
            live = [m.peer_id for m in me.live_peers() if m.mode == "dpo"]
            futs = {p: pool.submit(me.fetch, "params", p, r, DEADLINE_S) for p in ring_neighbours(live, me.peer_id)}
            for p, f in futs.items():
                got = f.result()
                if p in ids:
                    held[(i, ids[p], r)] = (time.monotonic(), got is not None)
            time.sleep(step_s)
            r += 1

    threads = [threading.Thread(target=rounds, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    rng = random.Random(seed)
    times = []
    try:
        time.sleep(5.0)
        for _ in range(kills):
            time.sleep(rng.uniform(*gap_s))
            before = nodes[0].stats()["dht_restarts"]
            t_kill = time.monotonic()
            os.kill(nodes[0].dht.child.pid, signal.SIGKILL)
            while nodes[0].stats()["dht_restarts"] == before:
                time.sleep(0.02)
            times.append((t_kill, time.monotonic()))
        time.sleep(DEADLINE_S + 5)
    finally:
        stop.set()
        for t in threads:
            t.join(DEADLINE_S + 15)
        pool.shutdown(wait=False, cancel_futures=True)
        for node in nodes:
            node.close()
    rows = []
    watchers = [ids[p] for p in ring_neighbours(list(ids), nodes[0].peer_id)]  # node 0's neighbours, all live
    for k, (t_kill, t_up) in enumerate(times):
        nxt = min((r for (i, r), t in published.items() if i == 0 and t >= t_kill), default=None)
        for j in watchers:
            when, ok = held.get((j, 0, nxt), (None, False)) if nxt is not None else (None, False)
            rows.append({"seed": seed, "kill": k, "neighbour": j, "restart_s": round(t_up - t_kill, 2),
                         "next_round": nxt,
                         "published_s": round(published[(0, nxt)] - t_kill, 2) if nxt is not None else None,
                         "held_s": round(when - t_kill, 2) if when is not None else None, "got": ok})
    return rows
