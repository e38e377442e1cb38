"""How fast a bootstrap answers DHT finds while a peer floods it with the largest StoreRequests it can send.

A real `swarm-node bootstrap` process on 127.0.0.1; a real hivemind DHT peer (tooling/dht_flood.py)
sends StoreRequests back to back, --concurrency at a time, for --duration seconds per shape; another real
hivemind DHT peer times one `rpc_find` every 0.2 s against the bootstrap meanwhile (a find that gets no
answer counts as --timeout). Shapes: `none` (no flood: the baseline, same run), `plain`, `subkeys` and
`dictionary` (4 MiB requests, hivemind's message cap: ~80k-140k one-byte records) and `within_bounds`
(4 dictionaries of 1,024 subkeys: the most a swarm-node DHT peer stores from one request). Prints per shape
the records per request, requests sent and answered, and the finds' median / p90 / max seconds.

    python -m benchmarks.dht_flood [--quick] [--seeds N] [--duration 30] [--concurrency 2] [--json F]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from swarm_node.runs.local_swarm import start_bootstrap
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json
from tooling.dht_flood import SHAPES, FindProbe, Flooder, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of flood per shape")
    ap.add_argument("--concurrency", type=int, default=2, help="requests in flight at once")
    ap.add_argument("--timeout", type=float, default=60.0, help="a find unanswered this long counts as this long")
    ap.add_argument("--shapes", default=",".join(("none", *SHAPES)))
    add_run_args(ap, seeds=1, quick="10 s per shape, plain and within_bounds",
                 seeds_help="a fresh bootstrap per seed (the seed names the flood's records); pooled")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    shapes = ["none", "plain", "within_bounds"] if args.quick else args.shapes.split(",")
    duration = 10.0 if args.quick else args.duration
    rows = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            boot = start_bootstrap(Path(tmp), f"flood{seed}")
            probe = FindProbe(boot.maddrs, key=f"probe{seed}")
            try:
                for shape in shapes:
                    row: dict = {"seed": seed, "shape": shape}
                    flooder = None
                    if shape != "none":
                        flooder = Flooder(boot.maddrs, shape, concurrency=args.concurrency)
                        row.update(records_per_request=flooder.records, request_bytes=flooder.request_bytes)
                        flooder.start(duration)
                    t0 = time.monotonic()
                    latencies = probe.probe(duration, timeout_s=args.timeout)
                    if flooder is not None:
                        row.update(flooder.join(duration + 4 * args.timeout))
                        flooder.stop()
                    row.update(summary(latencies), wall_s=round(time.monotonic() - t0, 1),
                               bootstrap_alive=boot.proc.poll() is None)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                probe.stop()
                boot.stop()
    print(f"\n{'shape':<14}{'records/req':>12}{'sent':>7}{'answered':>9}{'median s':>10}{'p90 s':>8}{'max s':>8}")
    for r in rows:
        print(f"{r['shape']:<14}{r.get('records_per_request', 0):>12}{r.get('sent', 0):>7}{r.get('answered', 0):>9}"
              f"{r['median_s']:>10.4f}{r['p90_s']:>8.4f}{r['max_s']:>8.4f}")
    worst = max((r["max_s"] for r in rows if r["shape"] != "none"), default=None)
    base = max((r["max_s"] for r in rows if r["shape"] == "none"), default=None)
    print(json.dumps({"worst_find_under_flood_s": worst, "worst_find_idle_s": base,
                      "ratio": round(worst / base, 1) if worst and base else None}))
    write_json(args.json, {"rows": rows}, args)


if __name__ == "__main__":
    main()
