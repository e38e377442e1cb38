"""`pipeline: true` against the plain round loop: seconds per round and what it learns, side by side.

One node alone (swarm off, so only the pipelining differs), the real round loop (`GRPONode.run_round`) on a
warmed-up preset, the same seed for both arms. Per seed the arms run one after the other (off, then on;
the order alternates with the seed so drifting machine load hits both alike). Held-out accuracy is greedy
exact match on the same eval problems before and after, so the on-off difference is paired per problem.

    python -m benchmarks.pipeline --seeds 3 --rounds 40 --json docs/data/pipeline.json
    python -m benchmarks.pipeline --quick
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from swarm_node.grpo.round import GRPONode
from swarm_node.runs.stats import combined_se, fmt_ms, mean_std, paired_se, verdict
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.benchmark_nodes import grpo_node, heldout_score, node_config


def make_node(model: str, seed: int, pipeline: bool, rounds: int, args, workdir: Path) -> GRPONode:
    cfg = node_config(model, seed, prompts=args.prompts, eval_n=args.eval_n, generations=args.g,
                      rounds=rounds, pipeline=pipeline)
    return grpo_node(cfg, workdir)


def hits(node: GRPONode) -> list[bool]:
    """Per held-out problem, scored as the node's own evaluation scores it. (The committed table scored in
    batches of 256, not the node's 64; greedy hits are identical either way on the presets.)"""
    return heldout_score(node).hits


def run_arm(model: str, seed: int, pipeline: bool, args, workdir: Path) -> dict:
    node = make_node(model, seed, pipeline, args.rounds, args, workdir)
    before = hits(node)
    rows = [node.run_round()]  # round 1 is not timed: first-call overheads, and nothing is in flight yet
    t0 = time.perf_counter()
    rows += [node.run_round() for _ in range(args.rounds - 1)]
    wall = time.perf_counter() - t0
    node.close()
    after = hits(node)
    return {"pipeline": pipeline, "seed": seed, "s_per_round": wall / max(1, args.rounds - 1),
            "gen_s": statistics.median(r["gen_s"] for r in rows[1:] or rows),
            "gen_wait_s": statistics.median(r["gen_wait_s"] for r in rows[1:] or rows),
            "train_s": statistics.median(r["train_s"] for r in rows[1:] or rows),
            "lag": [r["local_version_lag"] for r in rows][-1],
            "acc_before": float(np.mean(before)), "acc_after": float(np.mean(after)), "hits_after": after}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-s")
    add_run_args(ap, seeds=3, quick_seeds=1, first_seed=1, quick="8 rounds, 100 eval problems")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--eval-n", type=int, default=400)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds, args.eval_n = 8, 100
    if args.threads:
        torch.set_num_threads(args.threads)
    out = []
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        for seed in seeds:
            order = [False, True] if seed % 2 else [True, False]
            res = {p: run_arm(args.model, seed, p, args, Path(tmp) / f"s{seed}-{int(p)}") for p in order}
            off, on = res[False], res[True]
            out.append({"seed": seed, "off": off, "on": on, "speedup": off["s_per_round"] / on["s_per_round"],
                        "acc_diff": on["acc_after"] - off["acc_after"],
                        "paired_se": paired_se(on["hits_after"], off["hits_after"])})
            print(f"seed {seed}: s/round off {off['s_per_round']:.3f} on {on['s_per_round']:.3f} "
                  f"(x{out[-1]['speedup']:.2f}); acc off {off['acc_before']:.3f}->{off['acc_after']:.3f}, "
                  f"on {on['acc_before']:.3f}->{on['acc_after']:.3f} (diff {out[-1]['acc_diff']:+.3f} "
                  f"+- {out[-1]['paired_se']:.3f})", flush=True)
    diffs = [o["acc_diff"] for o in out]
    se = combined_se([o["paired_se"] for o in out], diffs)
    mean_diff = float(np.mean(diffs))
    print(f"\n| {args.model}, {args.rounds} rounds, {args.seeds} seeds | s/round | gen s (median) | round waits for "
          "own samples s | train s | acc start -> end |")
    print("|---|---|---|---|---|---|")
    for key, name in (("off", "pipeline: false"), ("on", "pipeline: true")):
        rs = [o[key] for o in out]
        print(f"| {name} | {fmt_ms(mean_std([r['s_per_round'] for r in rs]))} | "
              f"{fmt_ms(mean_std([r['gen_s'] for r in rs]))} | {fmt_ms(mean_std([r['gen_wait_s'] for r in rs]))} | "
              f"{fmt_ms(mean_std([r['train_s'] for r in rs]))} | {fmt_ms(mean_std([r['acc_before'] for r in rs]))} -> "
              f"{fmt_ms(mean_std([r['acc_after'] for r in rs]))} |")
    print(f"\nround time off / on: {fmt_ms(mean_std([o['speedup'] for o in out]), '.2f')} x; "
          f"end accuracy on - off: {mean_diff:+.3f} +- {se:.3f} (paired SE): {verdict(mean_diff, se)}")
    for o in out:
        for key in ("off", "on"):
            o[key].pop("hits_after")
    write_json(args.json, {"args": public_args(args, drop=("json",)), "seeds": out, "acc_diff": mean_diff,
                           "acc_diff_se": se, "verdict": verdict(mean_diff, se)}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
