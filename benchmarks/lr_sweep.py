"""Learning-rate sweep per preset: held-out accuracy gain of a node training alone, over several seeds.

For each arm (tiny-s full, tiny-s LoRA, tiny-m full) and learning rate, runs the real GRPO round loop
(`GRPONode`, on-policy, alone) for --rounds rounds from the preset and measures greedy accuracy on the
held-out `id` split before and after. Prints the mean gain over seeds with its standard error (seeds are
paired across learning rates: the same prompts and sampling seeds, so the best rate's advantage over each
other rate comes with a paired standard error), and the best learning rate per arm.

    python benchmarks/lr_sweep.py --quick --seeds 3
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

GRID = {
    "tiny-s": [1e-5, 3e-5, 1e-4, 3e-4],
    "tiny-s-lora": [1e-4, 3e-4, 1e-3, 3e-3],
    "tiny-m": [1e-5, 3e-5, 1e-4, 3e-4],
}
QUICK_GRID = {"tiny-s": [3e-5, 1e-4], "tiny-s-lora": [3e-4, 1e-3], "tiny-m": [3e-5, 1e-4]}


def run_one(arm: str, lr: float, seed: int, rounds: int, prompts: int, eval_n: int, state_dir: Path) -> dict:
    from swarm_node.config import NodeConfig
    from swarm_node.node.grpo_node import GRPONode

    cfg = NodeConfig.model_validate({
        "seed": seed,
        "model": {"path": "tiny-m" if arm == "tiny-m" else "tiny-s", "lora": {"enabled": arm.endswith("lora")}},
        "task": {"name": "arithmetic", "prompts_per_round": prompts, "eval_n": eval_n},
        "generation": {"num_generations": 8, "max_new_tokens": 6},
        "training": {"variant": "on_policy", "lr": lr},
        "metrics": {"eval_every": 10**6}, "checkpoint": {"every_rounds": 10**6},
    })
    torch.manual_seed(seed)
    node = GRPONode(cfg, state_dir)
    before = node.evaluate()["accuracy"]
    t0 = time.perf_counter()
    for _ in range(rounds):
        node.run_round()
    after = node.evaluate()["accuracy"]
    return {"arm": arm, "lr": lr, "seed": seed, "before": before, "after": after, "gain": after - before,
            "seconds": round(time.perf_counter() - t0, 1)}


def summarize(rows: list[dict]) -> dict:
    out: dict = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        per_lr = {}
        for lr in sorted({r["lr"] for r in rows if r["arm"] == arm}):
            gains = np.array([r["gain"] for r in rows if r["arm"] == arm and r["lr"] == lr])
            se = float(gains.std(ddof=1) / math.sqrt(len(gains))) if len(gains) > 1 else float("nan")
            per_lr[lr] = {"mean_gain": float(gains.mean()), "se": se, "n": len(gains)}
        best = max(per_lr, key=lambda k: per_lr[k]["mean_gain"])
        by_seed = {(r["lr"], r["seed"]): r["gain"] for r in rows if r["arm"] == arm}
        for lr, v in per_lr.items():  # paired by seed: the same prompts and sampling seeds at every rate
            d = np.array([by_seed[(best, s)] - by_seed[(lr, s)] for (x, s) in by_seed if x == lr and (best, s) in by_seed])
            v["best_minus_this"] = float(d.mean()) if len(d) else float("nan")
            v["paired_se"] = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
        out[arm] = {"by_lr": per_lr, "best_lr": best}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two learning rates per arm, 20 rounds, eval on 200")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--arms", default="tiny-s,tiny-s-lora,tiny-m")
    ap.add_argument("--rounds", type=int, default=None, help="default: 60 (20 with --quick)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per round (the demo's 16)")
    ap.add_argument("--eval-n", type=int, default=None, help="default: 400 (200 with --quick)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rounds = args.rounds or (20 if args.quick else 60)
    eval_n = args.eval_n or (200 if args.quick else 400)
    grid = QUICK_GRID if args.quick else GRID
    rows = []
    import tempfile

    for arm in args.arms.split(","):
        for lr in grid[arm]:
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory() as tmp:
                    r = run_one(arm, lr, seed + 1, rounds, args.prompts, eval_n, Path(tmp))
                rows.append(r)
                print(f"{arm} lr={lr:g} seed={r['seed']}: {r['before']:.3f} -> {r['after']:.3f} "
                      f"({r['gain']:+.3f}, {r['seconds']} s)", flush=True)
    summary = summarize(rows)
    print(f"\n{rounds} rounds x {args.prompts} prompts x 8 samples, alone, on-policy; held-out id split, n={eval_n}; "
          f"{args.seeds} seeds")
    print("| preset | learning rate | mean gain | SE over seeds | best minus this (paired SE) |")
    print("|---|---|---|---|---|")
    for arm, s in summary.items():
        for lr, v in s["by_lr"].items():
            mark = " (best)" if lr == s["best_lr"] else ""
            diff = "-" if lr == s["best_lr"] else f"{v['best_minus_this']:+.3f} ({v['paired_se']:.3f})"
            print(f"| {arm} | {lr:g}{mark} | {v['mean_gain']:+.3f} | {v['se']:.3f} | {diff} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": {a: {**s, "by_lr": {str(k): v for k, v in s["by_lr"].items()}}
                                                                  for a, s in summary.items()}}, indent=1))


if __name__ == "__main__":
    main()
