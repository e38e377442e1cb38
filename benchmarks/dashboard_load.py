"""How long the dashboard page takes to load with 100 and 10,000 metric rows, in headless Chromium.

Per row count and seed: a demo dir of 3 peers whose metrics.jsonl rows carry every key a GRPO node's row
has (random values from the seed; held-out eval every 5 rounds), the rows split evenly over the peers; the
page served by the dashboard's own server in this process; a fresh Chromium profile per load (cold cache,
so the page's scripts, uPlot's 51 KB among them, are fetched and parsed every time). Measured, side by side:

- server: the first /api/data (reading every file and computing every peer's numbers) and a warm one;
- page: navigation start to the first full render of the tables and the four charts (the page's
  `dashboard-rendered` mark, after its first /api/data), and to the load event.

    python -m benchmarks.dashboard_load [--quick] [--seeds N] [--seed S] [--rows 100 10000] [--json PATH]

Needs Debian's chromium and chromium-driver and selenium (the dev extra), like the browser test.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from swarm_node.dashboard.server import serve_dirs, stop
from swarm_node.runs.stats import mean_std
from tooling import browser  # the headless Chromium helper the dashboard test uses too
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json

PEERS = ("tiny-s", "tiny-m", "tiny-s-lora")
RENDERED_JS = """
const m = performance.getEntriesByName('dashboard-rendered');
const nav = performance.getEntriesByType('navigation')[0];
return m.length ? {rendered: m[0].startTime, load: nav ? nav.loadEventEnd : null} : null;
"""


def grpo_row(r: int, peer: str, rng: random.Random) -> dict:
    """A row with the keys of swarm_node/grpo/round.py's (async exchange, eval every 5 rounds)."""
    return {
        "round": r, "reward_mean": rng.random(), "loss": rng.uniform(-0.1, 0.1), "local_groups": rng.randint(0, 16),
        "external_groups": rng.randint(0, 24), "filtered": rng.randint(0, 6), "filtered_external": rng.randint(0, 4),
        "kept": rng.randint(60, 128), "zero_advantage_groups": rng.randint(0, 8), "mean_ratio_local": 1.0,
        "mean_ratio_external": rng.uniform(0.7, 1.3), "truncated_frac_external": rng.uniform(0, 0.1),
        "divergence_external": rng.uniform(0, 0.5), "grad_norm": rng.uniform(0, 3), "lr": 1e-4, "stepped": True,
        "tokens_per_s": rng.uniform(500, 900), "gen_s": rng.uniform(0.2, 1), "gen_wait_s": rng.uniform(0, 0.1),
        "policy_version": r - 1, "local_version_lag": 0, "train_s": rng.uniform(0.2, 2),
        "collect_s": rng.uniform(0, 0.01),
        "external_groups_by_peer": {f"12D3KooW{p}{'x' * 44}": rng.randint(0, 8) for p in PEERS if p != peer},
        "rejected": {"stale": 1} if rng.random() < 0.05 else {}, "rewards_overridden": 0, "checkpoint_failures": 0,
        "bytes_out": rng.randint(0, 9000), "bytes_in": rng.randint(0, 20000), "time": 1764600000.0 + r,
        "bytes_per_token": rng.uniform(1, 2), "payload_bytes_out": rng.randint(0, 9000),
        "control_bytes_in": rng.randint(0, 3000), "control_bytes_out": rng.randint(0, 3000),
        "batch_age_s_mean": rng.uniform(0, 5), "batch_age_s_max": rng.uniform(0, 9),
        "version_lag_mean": rng.uniform(0, 2), "version_lag_max": rng.randint(0, 3), "buffer_evicted": 0,
        "buffer_superseded": 0, "eval_accuracy": rng.uniform(0.2, 0.6) if r % 5 == 0 else None,
        **({"eval_n": 400} if r % 5 == 0 else {}),
    }


def make_demo_dir(root: Path, rows: int, seed: int) -> Path:
    rng = random.Random(seed)
    per_peer = [rows // len(PEERS) + (1 if i < rows % len(PEERS) else 0) for i in range(len(PEERS))]
    for peer, n in zip(PEERS, per_peer, strict=True):
        d = root / "swarm" / peer
        d.mkdir(parents=True)
        lines = [json.dumps({"round": 0, "eval_accuracy": 0.2, "eval_n": 400, "model": {"name": peer}})]
        lines += [json.dumps(grpo_row(r, peer, rng)) for r in range(1, n)]
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _page_load(url: str) -> tuple[dict, int, list[int]]:
    """(marks, peers shown, reward points per trace) of one load in a fresh Chromium."""
    with browser.chromium() as driver:
        driver.get(url)
        end = time.monotonic() + 60
        marks = None
        while marks is None and time.monotonic() < end:
            marks = driver.execute_script(RENDERED_JS)
            if marks is None:
                time.sleep(0.05)
        if marks is None:
            raise RuntimeError("the page never rendered")
        shown = driver.execute_script("return document.querySelectorAll('#peers tbody tr').length")
        points = driver.execute_script("return JSON.parse(document.getElementById('chart-reward').dataset.points)")
    return marks, shown, points


def measure(rows: int, seed: int) -> dict:
    """One row count, one seed: the API on a fresh server (cold, then warm), then the page on another fresh one."""
    with tempfile.TemporaryDirectory() as tmp:
        run = make_demo_dir(Path(tmp) / "demo", rows, seed)
        size = sum(p.stat().st_size for p in run.rglob("metrics.jsonl"))
        server, url = serve_dirs([run], 0, what="benchmark")
        try:
            t0 = time.perf_counter()
            doc = urllib.request.urlopen(url + "api/data", timeout=60).read()
            cold = time.perf_counter() - t0
            time.sleep(0.6)  # past the watcher's poll interval: the warm call re-polls the (unchanged) files
            t0 = time.perf_counter()
            urllib.request.urlopen(url + "api/data", timeout=60).read()
            warm = time.perf_counter() - t0
        finally:
            stop(server)
        # the first look at a node's page: a server that has read nothing yet, and a cold browser; then a second
        # fresh browser on the same server, which has the numbers already (what `swarm-node dashboard`, which
        # reads the files as it starts, gives every visitor)
        server, url = serve_dirs([run], 0, what="benchmark")
        try:
            marks, shown, points = _page_load(url)
            warm_marks, _, _ = _page_load(url)
        finally:
            stop(server)
    if shown != len(PEERS) or sum(points) < rows - 2 * len(PEERS) and rows <= 3 * 2000:
        raise RuntimeError(f"the page showed {shown} peers and {points} reward points for {rows} rows")
    return {"rows": rows, "seed": seed, "file_bytes": size, "json_bytes": len(doc), "api_cold_s": cold,
            "api_warm_s": warm, "page_rendered_s": marks["rendered"] / 1000,
            "page_load_event_s": (marks["load"] or 0) / 1000, "page_rendered_warm_server_s": warm_marks["rendered"] / 1000,
            "reward_points": points}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[100, 10_000])
    add_run_args(p, seeds=3, quick_seeds=1, quick="100 and 2,000 rows, one seed",
                 seeds_help="demo dirs per row count (the seed of their random metric values)")
    args = p.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.rows = [100, 2000]
    why = browser.missing()
    if why:
        print(f"dashboard_load: {why}", file=sys.stderr)
        return 2
    results = []
    for seed in seeds:
        for rows in args.rows:  # sizes side by side within each seed
            res = measure(rows, seed)
            results.append(res)
            print(f"seed {seed} rows {rows:>6}: api cold {res['api_cold_s'] * 1000:6.0f} ms, warm "
                  f"{res['api_warm_s'] * 1000:5.0f} ms; page rendered {res['page_rendered_s'] * 1000:6.0f} ms "
                  f"(load event {res['page_load_event_s'] * 1000:.0f} ms), on a warm server "
                  f"{res['page_rendered_warm_server_s'] * 1000:.0f} ms; JSON {res['json_bytes'] / 1e3:.0f} KB",
                  flush=True)
    keys = ("api_cold_s", "api_warm_s", "page_rendered_s", "page_load_event_s", "page_rendered_warm_server_s")
    print(f"\n{'rows':>7} {'api cold ms':>14} {'api warm ms':>14} {'page rendered ms':>18} {'load event ms':>15} "
          f"{'rendered, warm server':>22}")
    by_rows = {}
    for rows in args.rows:
        rs = [r for r in results if r["rows"] == rows]
        cols = [mean_std([r[k] * 1000 for r in rs]) for k in keys]
        by_rows[rows] = cols
        print(f"{rows:>7} " + " ".join(f"{m:>8.0f} +- {s:<4.0f}" for m, s in cols))
    lo, hi = min(args.rows), max(args.rows)
    worst = {k: max(r[k] for r in results if r["rows"] == hi) for k in ("page_rendered_s", "page_rendered_warm_server_s")}
    print(f"\npage rendered, {hi} rows / {lo} rows: {by_rows[hi][2][0] / by_rows[lo][2][0]:.2f}x (cold server), "
          f"{by_rows[hi][4][0] / by_rows[lo][4][0]:.2f}x (warm); slowest at {hi} rows: "
          f"{worst['page_rendered_s']:.2f} s cold server, {worst['page_rendered_warm_server_s']:.2f} s warm (target < 1 s)")
    write_json(args.json, {"results": results}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
