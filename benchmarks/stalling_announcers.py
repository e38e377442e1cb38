"""Two honest GRPO nodes sharing batches while --stallers identities announce batches and never deliver them.

Real processes on 127.0.0.1: a bootstrap, two honest tiny-s nodes (tooling/adversary.py's honest settings,
`swarm.max_peers_per_round` 4), and once both have run --warmup rounds (each is then established at the
other), tooling/adversary.py in mode `stall_announce`: --stallers identities, each its own p2pd, push a
batch announcement to both honest nodes every honest round and, asked for the batch, never answer (or
trickle one byte a second). Per honest node, over its rounds before the attack (baseline, same run) and
during it: of the batches the other honest node published meanwhile (one a round), the share it trained
on (each at most once), that count over the most it could have used (one a round of its own, so
min(its rounds, the other's)), the oldest it trained on (its age by its sender's clock), and the stalled
downloads it cut off (`swarm:stalled`, `swarm:timeout`).

    python -m benchmarks.stalling_announcers [--quick] [--stallers 64] [--attack-s 60] [--json F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarm_node.node.metrics import read_metrics
from swarm_node.runs.local_swarm import (
    Peer,
    child_env,
    start_bootstrap,
    stop_process,
    stop_processes,
    write_peer_config,
)
from tooling.adversary import honest_overrides
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json

ROOT = Path(__file__).resolve().parents[1]


def _rounds_after(path: Path, n: int, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and len(read_metrics(path)) > n:
            return True
        time.sleep(1.0)
    return False


def window(rows: list[dict], other: str, t0: float, t1: float) -> dict:
    """The rounds that ended in [t0, t1]: how many, how many trained on a batch of `other` (the last 8
    characters of its peer id, as metrics name peers), the oldest batch trained on."""
    ws = [r for r in rows if t0 <= r.get("time", 0) <= t1 and r.get("round", 0) > 0]
    took = [r for r in ws if any(k.split(":")[0] == other for k in (r.get("external_groups_by_peer") or {}))]
    ages = [r["batch_age_s_max"] for r in took if r.get("batch_age_s_max") is not None]
    return {"rounds": len(ws), "rounds_with_other": len(took),
            "share": round(len(took) / len(ws), 3) if ws else None,
            "max_batch_age_s": max(ages, default=None),
            "timeouts": sum((r.get("rejected") or {}).get(k, 0) for r in ws for k in ("swarm:stalled", "swarm:timeout")),
            "round_s": round((ws[-1]["time"] - ws[0]["time"]) / max(len(ws) - 1, 1), 2) if len(ws) > 1 else None}


def run_once(tmp: Path, presets: Path, seed: int, args) -> dict:
    template = ROOT / "peers" / "tiny-s.yaml"
    boot = start_bootstrap(tmp / "boot", "stall")
    peers = [Peer(name=n, config=write_peer_config(template, tmp / f"{n}.yaml", honest_overrides("stall", seed + i)
                                                   | {"task.prompts_per_round": args.prompts}),
                  state_dir=tmp / n) for i, n in enumerate(("honest-a", "honest-b"))]
    adv = None
    try:
        for p in peers:
            p.start(boot.maddrs)
        for p in peers:
            if not _rounds_after(p.metrics, args.warmup, 600):
                raise SystemExit(f"{p.name} did not reach round {args.warmup}; see {p.log_path}")
        out = tmp / "adversary.json"
        with open(tmp / "adversary.log", "w") as log:
            adv = subprocess.Popen(
                [sys.executable, str(ROOT / "tooling" / "adversary.py"), "--model-dir", str(presets / "tiny-s"),
                 "--maddr", boot.maddrs[0], "--swarm-id", "stall", "--out", str(out), "--state-dir",
                 str(tmp / "adversary-state"), "--modes", "stall_announce", "--min-mode-s", str(args.attack_s),
                 "--stallers", str(args.stallers), "--mode-timeout-s", str(args.attack_s + 60)],
                stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
            adv.wait(900)
        report = json.loads(out.read_text())
        time.sleep(5)
        codes = stop_processes([p.proc for p in peers], grace_s=60)
        rows = {p.name: read_metrics(p.metrics) for p in peers}
        t0, t1 = report["modes"]["stall_announce"]
        ids = {p.name: _peer_id(p) for p in peers}
        res: dict = {"seed": seed, "stallers": args.stallers, "attack_s": round(t1 - t0, 1), "codes": codes}
        start = max(rows[n][min(args.warmup, len(rows[n]) - 1)]["time"] for n in rows)
        for me, other in (("honest-a", "honest-b"), ("honest-b", "honest-a")):
            res[me] = {}
            for name, (a, b) in (("before", (start, t0)), ("during", (t0 + args.settle_s, t1))):
                w = window(rows[me], ids[other][-8:], a, b)
                sent = window(rows[other], "-", a, b)["rounds"]  # batches the other published meanwhile
                w["other_batches"] = sent
                w["used_share"] = round(w["rounds_with_other"] / sent, 3) if sent else None
                # a node trains on at most one of the other's batches a round: the most it could have used
                w["used_of_possible"] = round(w["rounds_with_other"] / min(sent, w["rounds"]), 3) if sent and w["rounds"] else None
                res[me][name] = w
        return res
    finally:
        if adv is not None and adv.poll() is None:
            stop_process(adv, grace_s=20)
        for p in peers:
            if p.running():
                stop_process(p.proc, grace_s=15)
        boot.stop()


def _peer_id(p: Peer) -> str:
    for line in p.log_path.read_text().splitlines():
        if "peer id " in line:
            return line.split("peer id ", 1)[1].split(";")[0].strip()
    return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stallers", type=int, default=64)
    ap.add_argument("--attack-s", type=float, default=60.0, help="seconds the stallers announce (every honest round)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per honest round (16: ~1 s rounds on 2 cores)")
    ap.add_argument("--warmup", type=int, default=8, help="honest rounds before the attack (baseline window)")
    ap.add_argument("--settle-s", type=float, default=0.0, help="seconds of the attack left out of its window")
    add_run_args(ap, seeds=1, first_seed=1, quick="16 stallers for 20 s")
    args = ap.parse_args()
    if args.quick:
        args.stallers, args.attack_s = 16, 20.0
    from benchmarks.attack import presets_root

    presets = presets_root()
    results = []
    for seed in resolve_seeds(args):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(run_once(Path(tmp), presets, seed, args))
            print(json.dumps(results[-1]), flush=True)
    print(f"\n{'node':<10}{'window':<8}{'rounds':>7}{'other sent':>11}{'used':>6}{'used share':>11}{'of possible':>12}"
          f"{'max age s':>10}{'cut off':>8}{'s/round':>8}")
    for r in results:
        for me in ("honest-a", "honest-b"):
            for w in ("before", "during"):
                x = r[me][w]
                print(f"{me:<10}{w:<8}{x['rounds']:>7}{x['other_batches']:>11}{x['rounds_with_other']:>6}"
                      f"{x['used_share']!s:>11}{x['used_of_possible']!s:>12}{x['max_batch_age_s']!s:>10}{x['timeouts']:>8}"
                      f"{x['round_s']!s:>8}")
    write_json(args.json, {"results": results}, args)


if __name__ == "__main__":
    main()
