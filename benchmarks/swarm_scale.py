"""Per-node network cost of the batch exchange as the swarm grows: network-only peers, synthetic batches.

Each size n starts a CLI bootstrap and n peers, each its own process (with its hivemind DHT child and
p2pd), on 127.0.0.1. A peer runs rounds of `--round-s` seconds: publish a batch of `--batch-bytes` random
bytes, take what arrived (K = `--k`), no model. Over a measurement window after everyone has joined it
reports, per node per round:

- payload_bytes_per_node_round: batch bytes downloaded (application level);
- control_bytes_per_node_round: every other byte on the loopback interface (DHT RPCs, pushed
  announcements, libp2p/TLS framing, TCP/IP headers), i.e. loopback bytes minus payload bytes. This
  needs a loopback interface of our own: the benchmark re-runs itself in a new user+network namespace
  (`unshare -rn`), so no other process's traffic is counted. Without one (--no-netns) it falls back to
  the nodes' own application-level counters (`control_app_bytes_per_node_round`, always reported);
- announcement-to-receipt latency (download complete minus the sender's generation time), round time,
  and the share of rounds that trained on K peers' batches.

`--membership full sampled` (the default) runs both ways of finding peers (the nodes' `swarm.membership`)
as arms: at each size every arm runs before the next size, so the arms share the machine's load, and one
JSON holds both. Each arm's control bytes are also given as a multiple of its own smallest size, side by
side. `--quick` runs 4 and 8 peers briefly.

    python -m benchmarks.swarm_scale --nodes 4 8 16 32 --membership full sampled --k 3 --fanout 3 \
        --warmup-s 15 --measure-s 40 --json docs/data/swarm_scale_arms.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.loopback import isolate, lo_bytes

ARMS = ("full", "sampled")

WORKER = r"""
import json, os, sys, time
from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw
boot, out, go, round_s, nbytes, k, fanout, idx, membership = sys.argv[1:10]
round_s, nbytes, k, fanout = float(round_s), int(nbytes), int(k), int(fanout)
cfg = SwarmConfig(enabled=True, swarm_id="scale", initial_peers=[boot], host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                  max_peers_per_round=k, push_fanout=fanout, bootstrap_retries=10, bootstrap_timeout_s=60,
                  membership=membership)
node = SwarmPeer(cfg, PeerInfo("grpo", f"synthetic-{idx}", "tok", "synthetic"), validate=keep_raw).start()
with open(out + ".ready", "w") as f:
    f.write(node.peer_id)
rows, r, window = [], 0, None
while window is None or time.time() < window[1]:
    if window is None and os.path.exists(go):  # every peer has joined: the window is set
        window = json.load(open(go))
    r += 1
    t0 = time.time()
    node.publish("batch", r, os.urandom(nbytes))
    got = node.receive(k)
    taken = time.time()
    if window is not None and window[0] <= t0 < window[1]:  # latency: receipt minus the sender's generation
        rows.append({"t": t0, "batches": len(got.batches), "payload_in": got.payload_bytes_in,
                     "payload_out": got.payload_bytes_out, "control_in": got.control_bytes_in,
                     "control_out": got.control_bytes_out,
                     "lat": [b.arrived - (taken - b.age_s) for b in got.batches],
                     "rejected": got.rejected, "events": got.events})
    time.sleep(max(0.0, t0 + round_s - time.time()))
json.dump({"peer_id": node.peer_id, "membership": node.cfg.membership, "rows": rows, "stats": node.stats()},
          open(out, "w"))
node.close()
"""


def run_size(n: int, arm: str, args: argparse.Namespace, work: Path) -> dict:
    """One swarm of n peers whose nodes run `swarm.membership = arm`, measured over the window."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    d = work / f"n{n}-{arm}"
    d.mkdir()
    boot = subprocess.Popen([sys.executable, "-m", "swarm_node.cli", "bootstrap", "--host-maddrs",
                             "/ip4/127.0.0.1/tcp/0", "--swarm", "scale"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    procs = []
    try:
        maddr = boot.stdout.readline().strip()
        go = d / "go.json"
        for i in range(n):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", WORKER, maddr, str(d / f"w{i}.json"), str(go), str(args.round_s),
                 str(args.batch_bytes), str(args.k), str(args.fanout), str(i), arm],
                stdout=subprocess.DEVNULL, stderr=open(d / f"w{i}.err", "w"), env=env))
            time.sleep(args.join_s_per_node)
        t_join = time.time()
        while sum((d / f"w{i}.json.ready").exists() for i in range(n)) < n and time.time() < t_join + args.join_timeout_s:
            time.sleep(0.5)
        joined = sum((d / f"w{i}.json.ready").exists() for i in range(n))
        t_start = time.time() + args.warmup_s
        t_end = t_start + args.measure_s
        go.write_text(json.dumps([t_start, t_end]))
        while time.time() < t_start:
            time.sleep(0.1)
        b0 = lo_bytes()
        while time.time() < t_end:
            time.sleep(0.1)
        b1 = lo_bytes()
        for p in procs:
            p.wait(timeout=300)
        results = [json.loads((d / f"w{i}.json").read_text()) for i in range(n) if (d / f"w{i}.json").exists()]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        boot.send_signal(signal.SIGINT)
        try:
            boot.wait(20)
        except subprocess.TimeoutExpired:
            boot.kill()
    rows = [r for w in results for r in w["rows"]]
    node_rounds = max(len(rows), 1)
    payload = sum(r["payload_in"] for r in rows)
    control_app = sum(r["control_in"] + r["control_out"] for r in rows)
    lat = sorted(x for r in rows for x in r["lat"])
    per_node_round_s = [args.measure_s / len(w["rows"]) for w in results if w["rows"]]  # rounds pace themselves
    lo = b1 - b0
    out = {
        "n": n,
        "membership": arm,
        "membership_seen": sorted({w.get("membership") for w in results}),  # what the nodes ran with
        "joined": joined,
        "completed": len(results),
        "node_rounds": len(rows),
        "round_s": statistics.median(per_node_round_s) if per_node_round_s else None,
        "payload_bytes_per_node_round": payload / node_rounds,
        "control_app_bytes_per_node_round": control_app / node_rounds,
        "loopback_bytes_per_node_round": lo / node_rounds if args.netns else None,
        "control_bytes_per_node_round": (lo - payload) / node_rounds if args.netns else control_app / node_rounds,
        "batches_per_round": sum(r["batches"] for r in rows) / node_rounds,
        "rounds_with_k": sum(r["batches"] >= args.k for r in rows) / node_rounds,
        "latency_median_s": lat[len(lat) // 2] if lat else None,
        "latency_p90_s": lat[int(len(lat) * 0.9)] if lat else None,
        "rejected": sum(sum(r["rejected"].values()) for r in rows),
    }
    return out


def run_order(nodes: list[int], arms: list[str]) -> list[tuple[int, str]]:
    """Sizes in order, every arm at a size before the next size: the arms see the same machine load."""
    return [(n, arm) for n in nodes for arm in arms]


def add_ratios(results: list[dict]) -> None:
    """Each result's control bytes as a multiple of its own arm's smallest size in this run (None where
    that is 0 bytes)."""
    base = {}
    for r in sorted(results, key=lambda r: r["n"], reverse=True):
        base[r["membership"]] = r["control_bytes_per_node_round"]
    for r in results:
        b = base[r["membership"]]
        r["control_ratio_vs_smallest"] = r["control_bytes_per_node_round"] / b if b else None


def side_by_side(results: list[dict], arms: list[str]) -> str:
    """A markdown table, one row per size, each arm's control bytes and ratio beside the others'."""
    by = {(r["n"], r["membership"]): r for r in results}
    sizes = sorted({r["n"] for r in results})
    smallest = {arm: min((r["n"] for r in results if r["membership"] == arm), default=None) for arm in arms}
    head = ["peers"]
    for arm in arms:
        head += [f"{arm}: control B/node/round", f"{arm}: x vs {smallest[arm]}", f"{arm}: app-level control",
                 f"{arm}: batches/round", f"{arm}: latency median / p90 s", f"{arm}: wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in sizes:
        row = [str(n)]
        for arm in arms:
            r = by.get((n, arm))
            if r is None:
                row += ["-"] * 6
                continue
            lat = (f"{r['latency_median_s']:.2f} / {r['latency_p90_s']:.2f}"
                   if r["latency_median_s"] is not None else "-")
            ratio = r.get("control_ratio_vs_smallest")
            row += [f"{r['control_bytes_per_node_round']:,.0f}", f"{ratio:.2f}" if ratio is not None else "-",
                    f"{r['control_app_bytes_per_node_round']:,.0f}", f"{r['batches_per_round']:.2f}", lat,
                    f"{r.get('wall_s', 0):.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--membership", nargs="+", choices=ARMS, default=list(ARMS),
                    help="arms: the nodes' swarm.membership; every arm runs at a size before the next size")
    ap.add_argument("--round-s", type=float, default=1.0, help="seconds per synthetic round")
    ap.add_argument("--batch-bytes", type=int, default=3700, help="synthetic batch size (a demo batch is ~3.7 KB)")
    ap.add_argument("--k", type=int, default=4, help="peer budget K")
    ap.add_argument("--fanout", type=int, default=4, help="push fanout F")
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--measure-s", type=float, default=60.0)
    ap.add_argument("--join-s-per-node", type=float, default=1.0, help="stagger between peer starts")
    ap.add_argument("--join-timeout-s", type=float, default=300.0, help="give up waiting for peers to join")
    ap.add_argument("--no-netns", dest="netns", action="store_false", help="do not isolate loopback")
    add_run_args(ap, seeds=1, quick="4 and 8 peers, short windows",
                 seeds_help="accepted for the benchmarks' interface: no randomness beyond the peers' own sampling")
    args = ap.parse_args()
    resolve_seeds(args)
    args.membership = list(dict.fromkeys(args.membership))
    if args.quick:
        args.nodes, args.warmup_s, args.measure_s = [4, 8], 10.0, 25.0
    code = isolate(args, "benchmarks.swarm_scale", "control bytes are the nodes' own counters")
    if code is not None:
        return code
    work = Path(tempfile.mkdtemp(prefix="swarm-scale-"))
    results: list[dict] = []
    stopped: set[str] = set()
    for n, arm in run_order(args.nodes, args.membership):
        if arm in stopped:
            continue
        t0 = time.time()
        res = run_size(n, arm, args, work)
        res["wall_s"] = round(time.time() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
        if res["completed"] < n:
            print(f"{arm}: only {res['completed']} of {n} peers finished: no larger size for this arm", flush=True)
            stopped.add(arm)
    add_ratios(results)
    print()
    print(side_by_side(results, args.membership))
    write_json(args.json, {"args": public_args(args, drop=("json",)), "netns": args.netns, "arms": args.membership,
                           "results": results}, args)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
