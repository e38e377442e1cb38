"""A public swarm's network on one machine: peers behind NAT, and a bootstrap that dies (needs root).

Each scenario builds a lab of network namespaces (tooling/netlab.py: a public segment, home NAT
routers) and runs real `swarm-node bootstrap` and tiny-s `swarm-node run` processes in it
(tooling/net_scenarios.py, the same code the slow tests assert on):

- `nat`: three public bootstraps, one public peer, two peers behind two NATs with `use_auto_relay`.
  Reported: process start to joined, the node's own DHT join time, seconds from start until each
  (receiver <- sender) pair first trained on the other's groups, and the bytes through the bootstraps'
  links (the relays; their DHT traffic included).
- `nat_no_relay`: the same without `use_auto_relay`, side by side: what the relay buys.
- `bootstrap_dies`: two bootstraps, two peers exchanging, one bootstrap SIGKILLed, then a newcomer that
  lists the dead one first. Reported: whether everyone exchanged after the kill, the newcomer's join.
- `link_cut`: three public peers; one's link goes down for `--down-s` seconds and comes back.
  Reported: its rounds and longest round gap during the cut (a stuck round shows there), and the
  seconds from the link's return until it and the others trained on each other's groups again.
- `thin_uplink`: 8 network-only peers (synthetic `--thin-batch-bytes` batches, 1 s rounds, K = 4, no
  model: the swarm layer alone), one on a 1 Mbit/s link and seven on 50 Mbit/s; `thin_control` is the
  same with all eight on 50 Mbit/s. Reported over a 40 s window: each peer's pace, batches taken per
  round and from the thin peer, and refusals by reason (a download past its deadline is `timeout`).

No latency or loss is emulated (this kernel has no netem). `--seeds N` repeats each scenario with node
seeds S..S+N-1; `--quick` runs one seed.

    python -m benchmarks.network --seeds 3 --json docs/data/network.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

SCENARIOS = ("nat", "nat_no_relay", "bootstrap_dies", "link_cut", "thin_uplink", "thin_control")


def run_one(name: str, seed: int, work: Path, timeout_s: float, down_s: float, thin_bytes: int = 64_000) -> dict:
    from tooling import net_scenarios  # from the checkout, shared with the slow tests

    t0 = time.monotonic()
    if name == "bootstrap_dies":
        out = net_scenarios.bootstrap_dies(work, timeout_s=timeout_s, seed=seed)
    elif name.startswith("thin_"):
        out = net_scenarios.thin_uplink(work, thin_mbit=1.0 if name == "thin_uplink" else 50.0,
                                        batch_bytes=thin_bytes)
    elif name == "link_cut":
        out = net_scenarios.link_cut(work, down_s=down_s, timeout_s=timeout_s, seed=seed)
    else:
        out = net_scenarios.nat(work, timeout_s=timeout_s, seed=seed, auto_relay=name == "nat")
    out.pop("logs", None)
    out.update(scenario=name, seed=seed, wall_s=round(time.monotonic() - t0, 1))
    return out


def table(results: list[dict]) -> str:
    lines = ["| scenario | seed | outcome | start to joined s | DHT join s | first batch s (receiver<-sender) "
             "| bootstrap link bytes |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if r["scenario"] == "bootstrap_dies":
            outcome = "all exchange after the kill" if r["all_exchange_after_kill"] else "NOT all exchanging"
            joined = f"newcomer {r['newcomer_start_to_joined_s']}"
            dht = ", ".join(f"{k} {v}" for k, v in r["dht_join_s"].items())
            first, link = f"everyone within {r['after_kill_s']} of the kill", "-"
        elif r["scenario"].startswith("thin_"):
            peers = r["peers"]
            others = [v for k, v in peers.items() if k != "thin" and v.get("rounds")]
            thin = peers.get("thin", {})
            timeouts = sum(v.get("rejected", {}).get("timeout", 0) for v in others)
            outcome = (f"thin {r['thin_mbit']:g} Mbit/s: its pace {thin.get('round_s')} s, takes "
                       f"{thin.get('batches_per_round')}/round; others' pace "
                       f"{sum(v['round_s'] for v in others) / max(len(others), 1):.2f} s, take "
                       f"{sum(v['from_thin_per_round'] for v in others) / max(len(others), 1):.2f}/round from thin; "
                       f"others' timeouts {timeouts}")
            joined, dht, first, link = "-", "-", "-", "-"
        elif r["scenario"] == "link_cut":
            outcome = (f"down {r['down_s']} s: {r['rounds_during_cut']} rounds, longest gap "
                       f"{r['longest_round_gap_s']} s; " + ("exchanging again" if r["exchange_after_restore"]
                                                           else "NOT exchanging again"))
            joined, dht = "-", ", ".join(f"{k} {v}" for k, v in r["dht_join_s"].items())
            first, link = f"rejoined {r['rejoin_s']} s after the link returned", "-"
        else:
            nat_pairs = [k for k in ("ha<-hb", "hb<-ha") if k in r["first_batch_s"]]
            outcome = "all 6 pairs" if r["all_pairs_shared"] else f"{len(r['first_batch_s'])} of 6 pairs"
            outcome += f"; NAT<->NAT {'yes' if len(nat_pairs) == 2 else 'no'}"
            joined = ", ".join(f"{k} {v}" for k, v in r["start_to_joined_s"].items())
            dht = ", ".join(f"{k} {v}" for k, v in r["dht_join_s"].items())
            first = ", ".join(f"{k} {v}" for k, v in sorted(r["first_batch_s"].items(), key=lambda kv: kv[1]))
            link = f"{r['bootstrap_link_bytes']:,}"
        lines.append(f"| {r['scenario']} | {r['seed']} | {outcome} | {joined} | {dht} | {first} | {link} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    ap.add_argument("--down-s", type=float, default=60.0, help="link_cut: how long the link is down (20 with --quick)")
    ap.add_argument("--thin-batch-bytes", type=int, default=64_000, help="thin_*: synthetic batch size")
    ap.add_argument("--timeout-s", type=float, default=120.0,
                    help="how long a scenario waits for its outcome (nat_no_relay: until both NAT'ed peers traded "
                         "with the public one and logged the unreachable line)")
    add_run_args(ap, seeds=3, quick="one seed, link_cut 20 s down", quick_seeds=1, first_seed=1)
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    from tooling import netlab

    reason = netlab.unavailable()
    if reason:
        raise SystemExit(reason)
    results = []
    for seed in seeds:
        for name in args.scenarios:
            work = Path(tempfile.mkdtemp(prefix=f"netbench-{name}-"))
            down = 20.0 if args.quick else args.down_s
            res = run_one(name, seed, work, args.timeout_s, down, args.thin_batch_bytes)
            print(json.dumps(res), flush=True)
            results.append(res)
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(results))
    write_json(args.json, {"args": public_args(args, drop=("json",)), "results": results}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
