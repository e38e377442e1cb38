"""Time from SIGKILL of a node's DHT child to a restarted, rejoined child, and to the next exchange.

Two SwarmNodes on 127.0.0.1: `first` starts the swarm, `joiner` joins through it. A thread keeps reading
announcements on the receiving node (as the round loop does while it collects) and the heartbeat runs at
--heartbeat; one node's child (--killed) is killed at a random moment, --trials times, and then one node
(--publisher: the other one, or the killed one itself) publishes a batch that the other must receive.
Prints each trial and the min / median / max.

    python -m benchmarks.dht_recovery --trials 10 --heartbeat 1.0 [--seeds 2] [--json out.json]
    python -m benchmarks.dht_recovery --killed first --publisher killed --trials 20   # the publisher's child
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

from benchmarks.args import add_run_args, resolve_seeds, write_json
from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmNode, keep_raw

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--killed", choices=("joiner", "first"), default="joiner",
                    help="whose DHT child is killed: the node that joined through the other, or the first node")
    ap.add_argument("--publisher", choices=("other", "killed"), default="other",
                    help="who publishes the batch after the restart: the node not killed, or the killed one")
    add_run_args(ap, seeds=1, quick="3 trials",
                 seeds_help="run --trials kills per seed (a seed: when, within 1-3 s, each kill comes); pooled")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    trials = 3 if args.quick else args.trials

    def cfg(**kw) -> SwarmConfig:
        return SwarmConfig(enabled=True, host_maddrs=LOOPBACK, heartbeat_s=args.heartbeat, record_ttl_s=30.0,
                           bootstrap_retries=1, bootstrap_timeout_s=5.0, **kw)

    info = PeerInfo(mode="grpo", model_name="m", tokenizer_fp="t", task_id="x")
    first = SwarmNode(cfg(), info, validate=keep_raw).start()
    joiner = SwarmNode(cfg(initial_peers=first.visible_maddrs()), info, validate=keep_raw).start()
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


if __name__ == "__main__":
    main()
