"""Memory of an honest GRPO node over many rounds with a hostile peer beside it (issue 11, "memory flat").

Starts a bootstrap and one honest tiny-s node (`swarm-node run`, a real process with its DHT child and
p2pd), and, in this process, a hostile swarm peer that announces bad batches (5 a second), in
turn: random junk, a zstd bomb (64 MiB of zeros declared), a msgpack bomb (16 M nested empty arrays), an
empty-plane payload, an oversized announcement (refused before download), a round from the future, and
a replay (the same valid completions re-encoded under a new round; only the first copy counts). It
samples the RSS of the node's process tree (node + DHT child + p2pd) as each metrics row appears, plots
RSS per round to a PNG, and prints start / end / max RSS and the slope per 100 rounds (least squares
after a warm-up), plus the refusals the node counted.

    python -m benchmarks.soak --rounds 200 --json soak.json --png soak.png
    python -m benchmarks.soak --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from swarm_node.node.metrics import read_metrics
from swarm_node.runs.local_swarm import Peer, start_bootstrap, stop_process, write_peer_config
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json

ROOT = Path(__file__).resolve().parents[1]  # peers/ (its bombs come from tooling/, shared with the tests)
ATTACKS = ("junk", "zstd_bomb", "msgpack_bomb", "empty_planes", "oversized", "future_round", "replay")


# ---- RSS of a process tree, from /proc -----------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss(pid: int) -> tuple[float, float]:
    """(RSS of the process, summed RSS of it and all its descendants) in MiB."""
    kids, todo, seen = _children(), [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += kids.get(p, [])
    return _rss_mib(pid), sum(_rss_mib(p) for p in seen)


# ---- the hostile peer ----------------------------------------------------------------------------------

class Attacker:
    """A swarm peer that looks like a usable GRPO peer (same task and tokenizer) and sends only bad batches."""

    def __init__(self, model_dir: Path, maddr: str, swarm_id: str, oversized: int):
        from transformers import AutoTokenizer

        from swarm_node.config import SwarmConfig
        from swarm_node.models.loading import tokenizer_fingerprint
        from swarm_node.swarm import PeerInfo, SwarmPeer
        from swarm_node.tasks.arithmetic import ArithmeticTask
        from tooling import batch_fuzz as pf

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.task = ArithmeticTask()
        self.fp = tokenizer_fingerprint(self.tok)
        cfg = SwarmConfig(enabled=True, swarm_id=swarm_id, initial_peers=[maddr], host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                          heartbeat_s=1.0, record_ttl_s=8.0, max_batch_bytes=2 * oversized)
        self.node = SwarmPeer(cfg, PeerInfo(mode="grpo", model_name="hostile", tokenizer_fp=self.fp,
                                            task_id=self.task.task_id), validate=None).start()
        self.swarm_id = swarm_id
        self.oversized = oversized
        self.zstd_bomb = pf.zeros_bomb(64 << 20)
        self.msgpack_bomb = pf.nested_arrays_bomb(16 << 20)
        self.empty_planes = pf.empty_planes_bomb()
        self.published = 0
        self.sent: Counter = Counter()
        self.rng = np.random.default_rng(0)

    def _replay(self, round_: int) -> bytes:
        """The same completions every time (so the replay window sees copies), under a new round number."""
        from swarm_node.generation.base import Sample
        from swarm_node.grpo.rollouts import LocalRollouts, score
        from swarm_node.protocol import encode_batch

        def sample(text: str) -> Sample:
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            return Sample(np.asarray(ids), np.full(len(ids), -0.7, dtype=np.float32), True)

        prompts = self.task.train_prompts(4, np.random.default_rng(1000))
        ids = [self.tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
        samples = [[sample(p.answer), sample(str(int(p.answer) + 1)), sample(p.answer), sample("7")] for p in prompts]
        batch = LocalRollouts(prompts, ids, samples, score(self.task, self.tok, prompts, samples)).to_batch(
            swarm_id=self.swarm_id, task_id=self.task.task_id, tokenizer_fp=self.fp, model_name="hostile",
            round_=round_, vocab_size=len(self.tok))
        return encode_batch(batch)

    def step(self) -> None:
        """One bad batch per call (the caller paces it), under the attacker's own increasing round numbers."""
        attack = ATTACKS[sum(self.sent.values()) % len(ATTACKS)]
        self.published += 1
        r = self.published
        self.node.set_round(r)  # its signed membership round follows, so its rounds stay plausible
        if attack == "junk":
            payload = self.rng.bytes(4096)
        elif attack == "zstd_bomb":
            payload = self.zstd_bomb
        elif attack == "msgpack_bomb":
            payload = self.msgpack_bomb
        elif attack == "empty_planes":
            payload = self.empty_planes
        elif attack == "oversized":
            payload = self.rng.bytes(self.oversized)
        elif attack == "future_round":
            self.node.publish("batch", 10**12, self.rng.bytes(512))
            self.sent[attack] += 1
            return
        else:
            payload = self._replay(r)
        self.node.publish("batch", r, payload)
        self.sent[attack] += 1

    def close(self) -> None:
        self.node.close()


# ---- the run -------------------------------------------------------------------------------------------

def slope_per_100(rounds: list[int], rss: list[float]) -> float:
    if len(rounds) < 3:
        return float("nan")
    return float(np.polyfit(np.asarray(rounds, float), np.asarray(rss, float), 1)[0] * 100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    add_run_args(ap, seeds=1, first_seed=1, quick="40 rounds", seeds_help="soaks one after another (the node's seed)")
    ap.add_argument("--attack-rate", type=float, default=5.0, help="bad batches announced per second")
    ap.add_argument("--warmup", type=int, default=None, help="rounds left out of the slope (default: 10%%, >= 10)")
    ap.add_argument("--out", default=None, help="work dir (default: a temp dir)")
    ap.add_argument("--png", default=None, help="RSS-per-round plot (default: OUT/soak.png; soak-seedS.png for several)")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    rounds = 40 if args.quick else args.rounds
    warm = args.warmup if args.warmup is not None else max(10, rounds // 10)
    out = Path(args.out or tempfile.mkdtemp(prefix="swarm-node-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in seeds:
        work = out if len(seeds) == 1 else out / f"seed{seed}"
        res = soak(seed, rounds, warm, args.attack_rate, work)
        png = Path(args.png) if args.png and len(seeds) == 1 else out / (
            "soak.png" if len(seeds) == 1 else f"soak-seed{seed}.png")
        show(res, png)
        results.append(res)
    write_json(args.json, {"results": results}, args)
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


def soak(seed: int, rounds: int, warm: int, attack_rate: float, out: Path) -> dict:
    """One honest node for `rounds` rounds beside the hostile peer; its RSS samples and refusals."""
    out.mkdir(parents=True, exist_ok=True)
    from swarm_node.models.factory import ensure_preset

    model_dir = ensure_preset("tiny-s")
    swarm_id = "soak"
    max_bytes = 4 << 20
    boot = start_bootstrap(out / "bootstrap", swarm_id)
    overrides = {"rounds": rounds, "seed": seed, "task.prompts_per_round": 4, "generation.num_generations": 4,
          "task.eval_n": 20,
          "metrics.eval_every": 1000, "checkpoint.every_rounds": 50, "swarm.swarm_id": swarm_id,
          "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "swarm.heartbeat_s": 1.0, "swarm.record_ttl_s": 8.0,
          "swarm.collect_deadline_s": 5.0, "swarm.bootstrap_timeout_s": 20.0, "swarm.max_batch_bytes": max_bytes}
    peer = Peer(name="honest", config=write_peer_config(ROOT / "peers" / "tiny-s.yaml", out / "honest.yaml", overrides),
                state_dir=out / "honest")
    attacker = None
    samples: list[tuple[int, float, float, float]] = []  # (round, node RSS, tree RSS, time)
    t0 = time.time()
    try:
        peer.start(boot.maddrs)
        attacker = Attacker(model_dir, boot.maddrs[0], swarm_id, oversized=max_bytes + (1 << 20))
        seen = -1
        next_attack = 0.0
        while peer.running():
            if time.monotonic() >= next_attack:
                attacker.step()
                next_attack = time.monotonic() + 1.0 / attack_rate
            rows = read_metrics(peer.metrics, warn=False)
            if rows and rows[-1]["round"] > seen:
                seen = rows[-1]["round"]
                main_rss, tree = tree_rss(peer.proc.pid)
                samples.append((seen, main_rss, tree, time.time() - t0))
                if seen % 20 == 0:
                    print(f"  round {seen}: node {main_rss:.0f} MiB, with DHT child and p2pd {tree:.0f} MiB", flush=True)
            time.sleep(0.1)
        code = peer.proc.wait()
    finally:
        if attacker is not None:
            attacker.close()
        if peer.running():
            stop_process(peer.proc, grace_s=30)
        boot.stop()
    rows = read_metrics(peer.metrics)
    rejected: Counter = Counter()
    for r in rows[1:]:
        rejected.update(r.get("rejected") or {})
    body = [s for s in samples if s[0] >= warm]
    res = {"rounds": rounds, "seed": seed, "exit_code": code, "warmup": warm, "seconds": round(time.time() - t0, 1),
           "attack_rate_per_s": attack_rate, "attacks_sent": dict(attacker.sent) if attacker else {}, "rejected": dict(rejected.most_common()),
           "external_groups_trained": sum(r.get("external_groups", 0) for r in rows[1:]),
           "samples": [{"round": r, "node_mib": round(a, 1), "tree_mib": round(b, 1), "t": round(t, 1)}
                       for r, a, b, t in samples]}
    for key, idx in (("node", 1), ("tree", 2)):
        vals = [s[idx] for s in body]
        if vals:
            res[key] = {"start_mib": round(float(np.median(vals[:10])), 1), "end_mib": round(float(np.median(vals[-10:])), 1),
                        "max_mib": round(max(vals), 1),
                        "slope_mib_per_100_rounds": round(slope_per_100([s[0] for s in body], vals), 2)}
    res["node_rounds"] = len(rows) - 1
    return res


def show(res: dict, png: Path) -> None:
    """Print one soak's summary and plot its RSS per round to `png`."""
    warm, rounds = res["warmup"], res["rounds"]
    print(f"\nhonest node (seed {res['seed']}): {res['node_rounds']} rounds in {res['seconds']:.0f}s, exit code "
          f"{res['exit_code']}; attacks sent {res['attacks_sent']}")
    print(f"refusals counted: {res['rejected']}; external groups trained on: {res['external_groups_trained']}")
    print(f"\n{'RSS (MiB)':<28} {'start':>7} {'end':>7} {'max':>7} {'slope /100 rounds':>18}   (rounds {warm}..{rounds})")
    for key, label in (("node", "node process"), ("tree", "node + DHT child + p2pd")):
        if key in res:
            s = res[key]
            print(f"{label:<28} {s['start_mib']:>7.1f} {s['end_mib']:>7.1f} {s['max_mib']:>7.1f} "
                  f"{s['slope_mib_per_100_rounds']:>18.2f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = res["samples"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([s["round"] for s in samples], [s["tree_mib"] for s in samples], label="node + DHT child + p2pd")
    ax.plot([s["round"] for s in samples], [s["node_mib"] for s in samples], label="node process")
    ax.axvline(warm, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("round")
    ax.set_ylabel("RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"honest tiny-s node beside a hostile peer ({rounds} rounds)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")


if __name__ == "__main__":
    sys.exit(main())
