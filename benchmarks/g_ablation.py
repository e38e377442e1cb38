"""F-TIS's filter threshold g: accuracy and filtered share over g in {5, 10, 50, 100, 200}, over seeds.

A tiny-s learner trains with F-TIS on its own groups plus groups sampled by a frozen tiny-m (another
architecture and size: the off-policy samples the filter is for), once per g, with the same seed, prompts
and source for every g of a seed. The filter drops negative-advantage external sequences whose mean
per-token divergence exceeds g (docs/algorithms.md); g = 50 is the default (`training.filter_threshold`).

Reported per g: held-out accuracy at the end (mean +- std over seeds), the filtered share of external
sequences, and the paired difference against g = 50 on the same problems and seeds, with its standard
error and a verdict ("cannot tell" unless beyond 2 SE; swarm_node/runs/stats.py).

    python -m benchmarks.g_ablation --seeds 3 --json g_ablation.json
    python -m benchmarks.g_ablation --quick                  # 2 seeds
    python -m benchmarks.g_ablation --merge g-s0.json g-s1.json g-s2.json   # seeds run as separate jobs
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.frozen_source import paired_table, run_learner
from swarm_node.runs.stats import fmt_ms
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

GS = (5.0, 10.0, 50.0, 100.0, 200.0)
DEFAULT_G = 50.0


def run_one(g: float, seed: int, args: argparse.Namespace) -> dict:
    return {"g": g} | run_learner({"variant": "ftis", "filter_threshold": g}, seed, args)


def summarise(runs: list[dict]) -> list[dict]:
    return sorted(paired_table(runs, "g", DEFAULT_G), key=lambda e: e["g"])


def show(table: list[dict], header: str) -> None:
    print(f"\n{header}\n")
    print(f"{'g':>6s} {'seeds':>9s} {'held-out acc':>16s} {'filtered share':>16s} {'vs g=50 (paired)':>18s}  verdict")
    for e in table:
        diff = "-" if np.isnan(e["diff"]) else f"{e['diff']:+.3f} +- {e['se']:.3f}"
        print(f"{e['g']:6g} {','.join(map(str, e['seeds'])):>9s} {fmt_ms(e['acc']):>16s} "
              f"{fmt_ms(e['filtered_share']):>16s} {diff:>18s}  {e['verdict']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=3, quick_seeds=2, quick="4 rounds, 8 prompts, n=100, g in {5, 50}")
    ap.add_argument("--g", type=float, nargs="+", default=list(GS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--eval-n", type=int, default=400)
    ap.add_argument("--learner", default="tiny-s")
    ap.add_argument("--source", default="tiny-m")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help="summarise runs from these --json files")
    args = ap.parse_args()
    if args.merge:
        docs = [json.loads(p.read_text()) for p in args.merge]
        runs = [r for d in docs for r in d["runs"]]
        a = docs[0]["args"]
        show(summarise(runs), f"merged {len(args.merge)} files: {a['rounds']} rounds, {a['prompts']} prompts x 8, "
                              f"held-out n={a['eval_n']}")
        return
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds, args.prompts, args.eval_n, args.g = 4, 8, 100, [5.0, DEFAULT_G]
    if DEFAULT_G not in args.g:
        args.g = [*args.g, DEFAULT_G]
    torch.set_num_threads(1)
    t0, runs = time.perf_counter(), []
    for seed in seeds:
        for g in args.g:
            r = run_one(g, seed, args)
            runs.append(r)
            print(f"[{time.perf_counter() - t0:5.0f}s] seed {seed} g {g:g}: acc {r['acc']:.3f}, filtered "
                  f"{r['filtered']} of {r['external_sequences']}", flush=True)
    table = summarise(runs)
    show(table, f"{args.learner} learner + frozen {args.source} samples, F-TIS, {args.rounds} rounds, {args.prompts} "
                f"prompts x 8 per round (own and external), held-out n={args.eval_n}; mean +- std over seeds")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    write_json(args.json, {"args": public_args(args, drop=("merge",)), "table": table, "runs": runs}, args)


if __name__ == "__main__":
    main()
