"""A fast peer beside a ~10x slower one: does the fast one keep its pace, and what does each learn?

Three settings, one after another (never in parallel), each for the same wall-clock budget, per seed:

- alone:    the fast node (peers/tiny-s.yaml) with the swarm disabled;
- async:    fast + slow (peers/tiny-m.yaml whose main process is SIGSTOPped `--stopped` of the time,
            0.8 by default as in tools/two-speed.sh), `swarm.exchange: async` (the default);
- lockstep: the same pair with `swarm.exchange: lockstep` (wait up to collect_deadline_s for K batches of
            rounds within staleness_rounds of ours: the synchronous setting of the paper).

Reported per setting: rounds of each node within the budget, the fast node's seconds per round and its
ratio to `alone`, its median collect_s, the share of the slow peer's batches (published in the window)
that the fast node trained on, and held-out accuracy of both nodes after the budget (each node's last
checkpoint, greedy, `--eval-n` prompts). Several seeds give paired differences with a standard error.

    python -m benchmarks.heterogeneous_speed --budget-s 120 --seeds 3 --json docs/data/heterogeneous_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from swarm_node.config import load_config
from swarm_node.grpo.round import GRPONode
from swarm_node.node.metrics import read_metrics
from swarm_node.runs.local_swarm import Peer, start_bootstrap, stop_processes, write_peer_config
from swarm_node.runs.stats import seeds_se
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.benchmark_nodes import heldout_score

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "peers"


def duty_cycle(pid: int, done: threading.Event, stopped: float, period: float = 1.0) -> None:
    while not done.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(period * stopped)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep(period * (1 - stopped))


def wait_row(peer: Peer, round_: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if peer.metrics.exists():
            rows = read_metrics(peer.metrics)
            if rows and rows[-1]["round"] >= round_:
                return
        if not peer.running():
            raise RuntimeError(f"{peer.name} exited early; see {peer.log_path}")
        time.sleep(0.3)
    raise RuntimeError(f"{peer.name} did not reach round {round_} in {timeout}s; see {peer.log_path}")


def evaluate(peer: Peer, eval_n: int) -> float:
    torch.set_num_threads(1)
    cfg = load_config(peer.config)
    node = GRPONode(cfg, peer.state_dir)
    node.resume()
    acc = heldout_score(node).accuracy if eval_n else float("nan")
    node.close()
    return acc


def run_setting(setting: str, seed: int, args: argparse.Namespace, work: Path) -> dict:
    d = work / f"{setting}-{seed}"
    swarm_id = f"hetero-{setting}-{seed}"
    base = {"rounds": 1_000_000, "metrics.eval_every": 1_000_000, "checkpoint.every_rounds": 1_000_000,
            "task.eval_n": args.eval_n, "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "swarm.swarm_id": swarm_id,
            "swarm.exchange": "lockstep" if setting == "lockstep" else "async"}
    fast = Peer("fast", write_peer_config(PEERS / "tiny-s.yaml", d / "fast.yaml",
                                          {**base, "seed": 100 + seed, "swarm.enabled": setting != "alone"}),
                d / "fast")
    peers = [fast]
    slow = None
    boot = None
    if setting != "alone":
        slow = Peer("slow", write_peer_config(PEERS / "tiny-m.yaml", d / "slow.yaml", {**base, "seed": 200 + seed}),
                    d / "slow")
        peers.append(slow)
        boot = start_bootstrap(d / "bootstrap", swarm_id)
    done = threading.Event()
    cycler = None
    try:
        for p in peers:
            p.start(boot.maddrs if boot else None, log_level="warning")
        for p in peers:
            wait_row(p, 0, 300)
        t0 = time.time()
        if slow is not None:
            cycler = threading.Thread(target=duty_cycle, args=(slow.proc.pid, done, args.stopped), daemon=True)
            cycler.start()
        time.sleep(args.budget_s)
        t1 = time.time()
        done.set()
        if cycler is not None:
            cycler.join()
            os.kill(slow.proc.pid, signal.SIGCONT)
        stop_processes([p.proc for p in peers], grace_s=60)
    finally:
        done.set()
        for p in peers:
            if p.running():
                os.kill(p.proc.pid, signal.SIGCONT)
        stop_processes([p.proc for p in peers if p.proc], grace_s=10)
        if boot is not None:
            boot.stop()

    def window(peer: Peer) -> list[dict]:
        return [r for r in read_metrics(peer.metrics) if r["round"] > 0 and t0 <= r["time"] <= t1]

    fr = window(fast)
    out = {"setting": setting, "seed": seed, "fast_rounds": len(fr),
           "fast_s_per_round": args.budget_s / max(len(fr), 1),
           "fast_collect_s_median": statistics.median(r.get("collect_s") or 0.0 for r in fr) if fr else None,
           "fast_acc": evaluate(fast, args.eval_n)}
    if slow is not None:
        sr = window(slow)
        used = sum(1 for r in fr for k, v in (r.get("external_groups_by_peer") or {}).items()
                   if k.endswith(":tiny-m") and v > 0)
        out.update({"slow_rounds": len(sr), "slow_batches_used_by_fast": used,
                    "share_of_slow_batches_used": used / max(len(sr), 1),
                    "fast_groups_from_slow": sum(v for r in fr for k, v in (r.get("external_groups_by_peer") or {}).items()
                                                 if k.endswith(":tiny-m")),
                    "slow_acc": evaluate(slow, args.eval_n)})
    return out


def paired(rows: list[dict], a: str, b: str, key: str) -> str:
    by = {(r["setting"], r["seed"]): r for r in rows}
    diffs = [by[(a, s)][key] - by[(b, s)][key] for s in sorted({r["seed"] for r in rows})
             if (a, s) in by and (b, s) in by]
    if len(diffs) < 2:
        return f"{diffs[0]:+.3f} (one seed: cannot tell)" if diffs else "-"
    return f"{statistics.mean(diffs):+.3f} +- {seeds_se(diffs):.3f} (n={len(diffs)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=120.0, help="wall-clock budget per setting")
    ap.add_argument("--stopped", type=float, default=0.8, help="share of time the slow node is SIGSTOPped")
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--settings", nargs="+", default=["alone", "async", "lockstep"])
    add_run_args(ap, seeds=1, quick="40 s budget, 50 eval prompts",
                 seeds_help="runs of every setting (node seeds 100 + S and 200 + S)")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.budget_s, args.eval_n = 40.0, 50
    work = Path(tempfile.mkdtemp(prefix="hetero-"))
    rows = []
    for seed in seeds:
        for setting in args.settings:
            res = run_setting(setting, seed, args, work)
            rows.append(res)
            print(json.dumps(res), flush=True)
    alone = {r["seed"]: r["fast_s_per_round"] for r in rows if r["setting"] == "alone"}
    print(f"\nbudget {args.budget_s:.0f} s per setting, slow node stopped {args.stopped:.0%} of the time; "
          f"work dir {work}")
    print("| setting | seed | fast rounds | slow rounds | fast s/round | x alone | fast median collect_s "
          "| share of slow batches used | fast acc | slow acc |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["fast_s_per_round"] / alone[r["seed"]] if r["seed"] in alone else float("nan")
        share = r.get("share_of_slow_batches_used")
        print(f"| {r['setting']} | {r['seed']} | {r['fast_rounds']} | {r.get('slow_rounds', '-')} | "
              f"{r['fast_s_per_round']:.3f} | {ratio:.2f} | {r['fast_collect_s_median']:.3f} | "
              f"{'-' if share is None else f'{share:.2f}'} | {r['fast_acc']:.3f} | "
              f"{r.get('slow_acc', float('nan')):.3f} |")
    if {"async", "lockstep"} <= set(args.settings):
        print(f"\nasync - lockstep, fast acc: {paired(rows, 'async', 'lockstep', 'fast_acc')}; "
              f"slow acc: {paired(rows, 'async', 'lockstep', 'slow_acc')}; "
              f"fast rounds: {paired(rows, 'async', 'lockstep', 'fast_rounds')}")
    if {"async", "alone"} <= set(args.settings):
        print(f"async - alone, fast acc: {paired(rows, 'async', 'alone', 'fast_acc')}")
    write_json(args.json, {"args": public_args(args), "results": rows}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
