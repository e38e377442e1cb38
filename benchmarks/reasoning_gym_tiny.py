"""Which reasoning-gym datasets can the tiny presets learn? Held-out accuracy before/after training alone.

For each candidate dataset (with a small config that fits a character model's context), runs the real
GRPO round loop alone on tiny-s for --rounds rounds per seed and prints the start and end greedy
accuracy on the held-out problems, the mean gain and its standard error over seeds.

    python -m benchmarks.reasoning_gym_tiny --quick --seeds 2
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import torch

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.benchmark_nodes import grpo_node, heldout_score, node_config

# name -> (dataset, generator config, prompt template or None for the full question)
CANDIDATES = {
    "chain_sum": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}, None),
    "chain_sum_short": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
                        "{metadata[expression]} ="),
    "chain_sum3_short": ("chain_sum", {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1},
                         "{metadata[expression]} ="),
    "basic_arithmetic": ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                              "operators": ["+", "-"]}, None),
    "products": ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, None),
}


def run(candidate: str, model: str, seed: int, rounds: int, prompts: int, eval_n: int, lr: float | None):
    dataset, config, template = CANDIDATES[candidate]
    spec = {"config": config, **({"template": template} if template else {})}
    cfg = node_config(model, seed, prompts=prompts, eval_n=eval_n, max_new_tokens=8,
                      task={"name": "reasoning_gym", "datasets": {dataset: spec}},
                      training={"variant": "on_policy", **({"lr": lr} if lr else {})})
    with tempfile.TemporaryDirectory() as tmp:
        node = grpo_node(cfg, Path(tmp))
        before = heldout_score(node).accuracy
        rewards = [node.run_round()["reward_mean"] for _ in range(rounds)]
        after = heldout_score(node).accuracy
    return before, after, float(np.mean(rewards[: max(1, rounds // 4)])), float(np.mean(rewards[-max(1, rounds // 4):]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, seeds=2, first_seed=1, quick="20 rounds, eval on 100")
    ap.add_argument("--model", default="tiny-s")
    ap.add_argument("--datasets", default=",".join(CANDIDATES))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--lr", type=float, default=None, help="default: the preset's")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    torch.set_num_threads(1)
    rounds = args.rounds or (20 if args.quick else 60)
    eval_n = 100 if args.quick else 200
    out = {}
    for name in args.datasets.split(","):
        rows = [run(name, args.model, s, rounds, args.prompts, eval_n, args.lr) for s in seeds]
        gains = np.array([a - b for b, a, _, _ in rows])
        se = float(gains.std(ddof=1) / math.sqrt(len(gains))) if len(gains) > 1 else float("nan")
        out[name] = {"spec": CANDIDATES[name], "runs": rows, "mean_gain": float(gains.mean()), "se": se}
        print(f"{name} {CANDIDATES[name]}: " + ", ".join(f"{b:.3f}->{a:.3f} (reward {r0:.3f}->{r1:.3f})"
                                                                  for b, a, r0, r1 in rows)
              + f"; mean gain {gains.mean():+.3f} +- {se:.3f}", flush=True)
    write_json(args.json, {"args": public_args(args), "datasets": out}, args)


if __name__ == "__main__":
    main()
