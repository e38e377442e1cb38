"""The GRPO loss variants side by side on off-policy samples from another model, over seeds.

A tiny-s learner trains for N rounds on its own groups plus groups sampled by a frozen tiny-m (another
architecture and size, same tokenizer: benchmarks/frozen_source.py), once per variant; for one seed every
variant sees the same prompts and the same external samples and is scored on the same held-out problems.
Reported per variant: held-out accuracy at the end (mean +- std over seeds), the share of external sequences
the filter dropped, the mean external ratio, and the difference against `on_policy` (which trains on the
learner's own groups only: training alone), paired per problem, with its standard error and a verdict
("cannot tell" unless beyond 2 SE).

    python -m benchmarks.offpolicy --seeds 3 --json offpolicy.json
    python -m benchmarks.offpolicy --quick                   # 2 seeds
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.frozen_source import paired_table, run_learner
from swarm_node.runs.stats import fmt_ms
from swarm_node.training.ftis import VARIANTS
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

BASE = "on_policy"  # trains on the learner's own groups only (the F-TIS step skips external ones): the baseline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=3, quick_seeds=2, quick="4 rounds, 8 prompts, n=100, on_policy/naive/ftis")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--eval-n", type=int, default=400)
    ap.add_argument("--learner", default="tiny-s")
    ap.add_argument("--source", default="tiny-m")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds, args.prompts, args.eval_n, args.variants = 4, 8, 100, [BASE, "naive", "ftis"]
    if BASE not in args.variants:
        args.variants = [BASE, *args.variants]
    torch.set_num_threads(1)
    t0, runs = time.perf_counter(), []
    for seed in seeds:
        for v in args.variants:
            r = {"variant": v} | run_learner({"variant": v}, seed, args)
            runs.append(r)
            print(f"[{time.perf_counter() - t0:5.0f}s] seed {seed} {v:9s} acc {r['acc']:.3f}, "
                  f"filtered {r['filtered']} of {r['external_sequences']}", flush=True)
    table = paired_table(runs, "variant", BASE)
    print(f"\n{args.learner} learner + frozen {args.source} samples, {args.rounds} rounds, {args.prompts} prompts x 8 "
          f"per round (own and external), held-out n={args.eval_n}; mean +- std over seeds "
          f"{args.seed}..{args.seed + args.seeds - 1}; vs on_policy = paired difference (+- SE)\n")
    print(f"{'variant':9s} {'held-out acc':>16s} {'filtered share':>16s} {'ext ratio':>9s} {'vs on_policy':>16s}  "
          f"verdict      finite")
    for e in table:
        diff = "-" if np.isnan(e["diff"]) else f"{e['diff']:+.3f} +- {e['se']:.3f}"
        ratio = e["mean_ratio_external"][0]
        print(f"{e['variant']:9s} {fmt_ms(e['acc']):>16s} {fmt_ms(e['filtered_share']):>16s} "
              f"{'-' if np.isnan(ratio) else f'{ratio:.2f}':>9s} {diff:>16s}  {e['verdict']:12s} {e['params_finite']}")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    write_json(args.json, {"args": public_args(args), "table": table, "runs": runs}, args)


if __name__ == "__main__":
    main()
