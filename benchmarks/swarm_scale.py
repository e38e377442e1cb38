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

Ratios against the smallest size are printed from the same run. `--quick` runs 4 and 8 peers briefly.

    python -m benchmarks.swarm_scale --nodes 4 8 16 32 --json docs/data/swarm_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

WORKER = r"""
import json, os, sys, time
from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw
boot, out, go, round_s, nbytes, k, fanout, idx = sys.argv[1:9]
round_s, nbytes, k, fanout = float(round_s), int(nbytes), int(k), int(fanout)
cfg = SwarmConfig(enabled=True, swarm_id="scale", initial_peers=[boot], host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                  max_peers_per_round=k, push_fanout=fanout, bootstrap_retries=10, bootstrap_timeout_s=60)
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
json.dump({"peer_id": node.peer_id, "rows": rows, "stats": node.stats()}, open(out, "w"))
node.close()
"""


def lo_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])  # transmitted bytes (each loopback packet is sent once)
    return 0


def run_size(n: int, args: argparse.Namespace, work: Path) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    d = work / f"n{n}"
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
                 str(args.batch_bytes), str(args.k), str(args.fanout), str(i)],
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32])
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
    if args.quick:
        args.nodes, args.warmup_s, args.measure_s = [4, 8], 10.0, 25.0
    if args.netns and os.environ.get("SWARM_SCALE_IN_NETNS") != "1":
        if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"]).returncode == 0:
            cmd = "ip link set lo up && exec " + shlex.join([sys.executable, "-m", "benchmarks.swarm_scale", *sys.argv[1:]])
            return subprocess.run(["unshare", "-rn", "sh", "-c", cmd],
                                  env={**os.environ, "SWARM_SCALE_IN_NETNS": "1"}).returncode
        print("no user+network namespace available: control bytes are the nodes' own counters", file=sys.stderr)
        args.netns = False
    work = Path(tempfile.mkdtemp(prefix="swarm-scale-"))
    results = []
    for n in args.nodes:
        t0 = time.time()
        res = run_size(n, args, work)
        res["wall_s"] = round(time.time() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
        if res["completed"] < n:
            print(f"only {res['completed']} of {n} peers finished: stopping here", flush=True)
            break
    base = results[0]
    print(f"\n| peers | control B/node/round | x vs {base['n']} | app-level control | payload B/node/round "
          f"| batches/round | latency median / p90 s | round s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        ratio = r["control_bytes_per_node_round"] / base["control_bytes_per_node_round"]
        lat = f"{r['latency_median_s']:.2f} / {r['latency_p90_s']:.2f}" if r["latency_median_s"] is not None else "-"
        print(f"| {r['n']} | {r['control_bytes_per_node_round']:,.0f} | {ratio:.2f} | "
              f"{r['control_app_bytes_per_node_round']:,.0f} | {r['payload_bytes_per_node_round']:,.0f} | "
              f"{r['batches_per_round']:.2f} | {lat} | {r['round_s']:.2f} |")
    write_json(args.json, {"args": public_args(args, drop=("json",)), "netns": args.netns, "results": results}, args)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
