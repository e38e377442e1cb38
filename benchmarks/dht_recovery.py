"""Time from SIGKILL of a node's DHT child to a restarted, rejoined child, and to the next exchange.

Two SwarmNodes on 127.0.0.1; a thread keeps reading announcements (as the round loop does while it
collects) and the heartbeat runs at --heartbeat; the child is killed at a random moment, --trials times.
Prints each trial and the min / median / max.

    python benchmarks/dht_recovery.py --trials 10 --heartbeat 1.0 [--seeds 2] [--json out.json]
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
from swarm_node.swarm import PeerInfo, SwarmNode

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="first seed (when, within 1-3 s, each kill comes)")
    ap.add_argument("--seeds", type=int, default=1, help="run --trials kills per seed; the summary pools them")
    ap.add_argument("--quick", action="store_true", help="3 trials")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    trials = 3 if args.quick else args.trials

    def cfg(**kw) -> SwarmConfig:
        return SwarmConfig(enabled=True, host_maddrs=LOOPBACK, heartbeat_s=args.heartbeat, record_ttl_s=30.0,
                           bootstrap_retries=1, bootstrap_timeout_s=5.0, **kw)

    info = PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x")
    a = SwarmNode(cfg(), info).start()
    b = SwarmNode(cfg(initial_peers=a.visible_maddrs()), info).start()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            b._read_announcements("batch")
            time.sleep(0.05)

    threading.Thread(target=reader, daemon=True).start()
    rows = []
    try:
        for seed in range(args.seed, args.seed + args.seeds):
            rng = random.Random(seed)
            for trial in range(trials):
                time.sleep(rng.uniform(1.0, 3.0))
                before, t0 = b.stats()["dht_restarts"], time.monotonic()
                os.kill(b._dht.pid, signal.SIGKILL)
                while b.stats()["dht_restarts"] == before:
                    time.sleep(0.02)
                restarted = time.monotonic() - t0
                a.publish("batch", len(rows), os.urandom(10_000))  # a round number no earlier trial used
                got = b.collect("batch", len(rows), k=1, staleness=0, deadline_s=20)
                rows.append({"seed": seed, "trial": trial, "restart_s": round(restarted, 2),
                             "exchange_s": round(time.monotonic() - t0, 2), "received": len(got)})
                print(rows[-1], flush=True)
    finally:
        stop.set()
        b.close()
        a.close()
    r = [x["restart_s"] for x in rows]
    e = [x["exchange_s"] for x in rows]
    summary = {"heartbeat_s": args.heartbeat, "seeds": sorted({x["seed"] for x in rows}), "trials": len(rows),
               "restart_min_s": min(r),
               "restart_median_s": statistics.median(r), "restart_max_s": max(r), "exchange_median_s": statistics.median(e),
               "exchange_max_s": max(e), "all_received": all(x["received"] == 1 for x in rows)}
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": summary, "trials": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
