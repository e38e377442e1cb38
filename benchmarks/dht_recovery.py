"""Time from SIGKILL of a node's DHT child to a restarted, rejoined child, and to the next exchange.

Two SwarmPeers on 127.0.0.1: `first` starts the swarm, `joiner` joins through it. A thread keeps reading
announcements on the receiving node (as the round loop does while it collects) and the heartbeat runs at
--heartbeat; one node's child (--killed) is killed at a random moment, --trials times, and then one node
(--publisher: the other one, or the killed one itself) publishes a batch that the other must receive.
Prints each trial and the min / median / max.

`--exchange dpo` measures DPO's path instead (parameters are fetched by DHT announcement, not pushed):
--nodes SwarmPeers on a ring with the DPO demo's swarm settings (peers/dpo-ring-*.yaml: heartbeat 2 s,
record TTL 20 s, 20 s fetch deadline) each run rounds as a DPO node does: publish --payload bytes of
parameters, fetch both ring neighbours' same round in parallel, then --step seconds of local steps. Node
0's DHT child is SIGKILLed --trials times, 2-5 s apart; per kill and neighbour: seconds from the kill until
the neighbour holds node 0's next round (the first it published after the kill), and whether it got it.

    python -m benchmarks.dht_recovery --trials 10 --heartbeat 1.0 [--seeds 2] [--json out.json]
    python -m benchmarks.dht_recovery --killed first --publisher killed --trials 20   # the publisher's child
    python -m benchmarks.dht_recovery --exchange dpo --trials 10 [--nodes 4] [--payload 2000000]
    python -m benchmarks.dht_recovery --exchange dpo_nodes --trials 10

`--exchange dpo_nodes` does the same with real DPO nodes: a bootstrap and the four `swarm-node run`
processes of peers/dpo-ring-*.yaml (tiny-s, debug logs), node 0's DHT child (the forked process whose
child is p2pd) SIGKILLed --trials times 4-8 s apart. Per other node (the one across the ring fetches
nothing from node 0) it reads the rounds whose average lacked node 0 (metrics `missing_neighbours`; the last 3 rounds, cut by the stop, left out)
and, from the debug lines of every fetch of node 0's parameters, the slowest and those over 5 s; and
node 0's own rounds over 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import threading
import time

from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--killed", choices=("joiner", "first"), default="joiner",
                    help="whose DHT child is killed: the node that joined through the other, or the first node")
    ap.add_argument("--publisher", choices=("other", "killed"), default="other",
                    help="who publishes the batch after the restart: the node not killed, or the killed one")
    ap.add_argument("--exchange", choices=("push", "dpo", "dpo_nodes"), default="push",
                    help="push: a GRPO batch announced by push; dpo: DPO rounds on a ring, fetched by announcement; "
                    "dpo_nodes: the same with real DPO node processes")
    ap.add_argument("--nodes", type=int, default=4, help="dpo: nodes on the ring")
    ap.add_argument("--payload", type=int, default=2_000_000, help="dpo: bytes of one node's parameters")
    ap.add_argument("--step", type=float, default=0.3, help="dpo: seconds of local steps per round")
    add_run_args(ap, seeds=1, quick="3 trials",
                 seeds_help="run --trials kills per seed (a seed: when, within 1-3 s, each kill comes); pooled")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    trials = 3 if args.quick else args.trials
    if args.exchange == "dpo":
        return dpo_ring(args, seeds, trials)
    if args.exchange == "dpo_nodes":
        return dpo_nodes(args, seeds, trials)

    def cfg(**kw) -> SwarmConfig:
        return SwarmConfig(enabled=True, host_maddrs=LOOPBACK, heartbeat_s=args.heartbeat, record_ttl_s=30.0,
                           bootstrap_retries=1, bootstrap_timeout_s=5.0, **kw)

    info = PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x")
    first = SwarmPeer(cfg(), info, validate=keep_raw).start()
    joiner = SwarmPeer(cfg(initial_peers=first.visible_maddrs()), info, validate=keep_raw).start()
    killed = joiner if args.killed == "joiner" else first
    other = first if killed is joiner else joiner
    sender, receiver = (killed, other) if args.publisher == "killed" else (other, killed)
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            receiver.membership.read_announcements("batch")
            time.sleep(0.05)

    threading.Thread(target=reader, daemon=True).start()
    rows = []
    try:
        for seed in seeds:
            rng = random.Random(seed)
            for trial in range(trials):
                time.sleep(rng.uniform(1.0, 3.0))
                before, t0 = killed.stats()["dht_restarts"], time.monotonic()
                os.kill(killed.dht.child.pid, signal.SIGKILL)
                while killed.stats()["dht_restarts"] == before:
                    time.sleep(0.02)
                restarted = time.monotonic() - t0
                sender.publish("batch", len(rows), os.urandom(10_000))  # a round number no earlier trial used
                got = receiver.receive(1, lockstep=True, round=len(rows), staleness=0, deadline_s=20).batches
                rows.append({"seed": seed, "trial": trial, "restart_s": round(restarted, 2),
                             "exchange_s": round(time.monotonic() - t0, 2), "received": len(got)})
                if not got:  # what the receiver saw instead, and what the sender's pushes did
                    st, sent = receiver.stats(), sender.stats()
                    rows[-1]["why"] = {"view": len(receiver.view), "announcements_in": st["announcements_in"],
                                       "duplicate": st["duplicate"], "rejected": st["rejected"],
                                       "pushes_out": sent["announcements_out"], "push_failed": sent["push_failed"],
                                       "sender_view": len(sender.view)}
                print(rows[-1], flush=True)
    finally:
        stop.set()
        joiner.close()
        first.close()
    r = [x["restart_s"] for x in rows]
    e = [x["exchange_s"] for x in rows]
    summary = {"heartbeat_s": args.heartbeat, "killed": args.killed, "publisher": args.publisher, "seeds": sorted({x["seed"] for x in rows}), "trials": len(rows),
               "restart_min_s": min(r),
               "restart_median_s": statistics.median(r), "restart_max_s": max(r), "exchange_median_s": statistics.median(e),
               "exchange_max_s": max(e), "all_received": all(x["received"] == 1 for x in rows)}
    print(json.dumps(summary))
    write_json(args.json, {"summary": summary, "trials": rows}, args)


def dpo_ring(args, seeds: list[int], trials: int) -> None:
    """Node 0 of a ring of DPO-like SwarmPeers loses its DHT child; how soon do its neighbours hold its
    next round's parameters? (tooling/dpo_ring.py)"""
    from tooling.dpo_ring import DEADLINE_S, kill_and_watch

    rows = []
    for seed in seeds:
        rows += kill_and_watch(args.nodes, trials, seed=seed, payload=args.payload, step_s=args.step)
        for row in [r for r in rows if r["seed"] == seed]:
            print(row, flush=True)
    held_s = [x["held_s"] if x["got"] else DEADLINE_S for x in rows]
    summary = {"exchange": "dpo", "nodes": args.nodes, "payload": args.payload, "kills": len(rows) // 2,
               "fetches": len(rows), "got": sum(x["got"] for x in rows),
               "held_median_s": statistics.median(held_s), "held_max_s": max(held_s),
               "over_5s": sum(h > 5.0 for h in held_s),
               "restart_median_s": statistics.median(x["restart_s"] for x in rows)}
    print(json.dumps(summary))
    write_json(args.json, {"summary": summary, "trials": rows}, args)


def dpo_nodes(args, seeds: list[int], trials: int) -> None:
    """Real DPO node processes on a ring; node 0's DHT child is killed; what its neighbours got."""
    import re
    import tempfile
    from pathlib import Path

    from swarm_node.models.factory import ensure_preset
    from swarm_node.models.presets import default_presets_dir
    from swarm_node.node.metrics import read_metrics
    from swarm_node.runs.local_swarm import Peer, start_bootstrap, stop_processes, write_peer_config
    from swarm_node.swarm.dht import _children_of

    root = Path(__file__).resolve().parents[1]
    presets = default_presets_dir()
    ensure_preset("tiny-s", presets)
    os.environ["SWARM_NODE_PRESETS"] = str(presets)

    def dht_child(pid: int) -> int | None:
        for c in _children_of(pid):
            if any(b"p2pd" in Path(f"/proc/{g}/cmdline").read_bytes() for g in _children_of(c)):
                return c
        return None

    results = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp_s:
            tmp = Path(tmp_s)
            boot = start_bootstrap(tmp / "boot", "dpo-demo")
            peers = [Peer(name=f"n{i}", state_dir=tmp / f"n{i}", config=write_peer_config(
                root / "peers" / f"dpo-ring-{i}.yaml", tmp / f"n{i}.yaml",
                {"rounds": 1000, "seed": seed + i, "metrics.eval_every": 1000, "dpo.pairs_per_user": 64,
                 "dpo.heldout_pairs": 16})) for i in range(4)]
            try:
                for p in peers:
                    p.start(boot.maddrs, log_level="debug")
                end = time.monotonic() + 600
                while time.monotonic() < end and min(len(read_metrics(p.metrics)) if p.metrics.exists() else 0
                                                     for p in peers) < 5:
                    time.sleep(1.0)
                rng = random.Random(seed)
                for _ in range(trials):
                    time.sleep(rng.uniform(4.0, 8.0))
                    os.kill(dht_child(peers[0].proc.pid), signal.SIGKILL)
                time.sleep(30)
            finally:
                stop_processes([p.proc for p in peers], grace_s=60)
                boot.stop()
            rows = {p.name: read_metrics(p.metrics) for p in peers}
            pid0 = rows["n0"][-1]["peer_id"]
            last = min(len(v) for v in rows.values()) - 3
            res = {"seed": seed, "kills": trials, "rounds": {n: len(v) for n, v in rows.items()},
                   "node0_rounds_over_3s": [(r["round"], r["seconds"]) for r in rows["n0"] if r["seconds"] > 3]}
            for p in peers[1:]:
                log = p.log_path.read_text()
                got = [float(s) for s in re.findall(rf"fetch\(params, {pid0}, round \d+\): \d+ bytes after ([\d.]+)s", log)]
                failed = re.findall(rf"fetch\(params, {pid0}, round (\d+)\): (?!\d+ bytes)(\S+)", log)
                res[p.name] = {"missed_rounds": [r["round"] for r in rows[p.name]
                                                 if pid0 in r["missing_neighbours"] and r["round"] < last],
                               "fetches": len(got), "slowest_s": max(got, default=None),
                               "over_5s": sum(x > 5.0 for x in got), "failed": failed[:10]}
            results.append(res)
            print(json.dumps(res), flush=True)
    write_json(args.json, {"results": results}, args)


if __name__ == "__main__":
    main()
