"""Side-by-side comparison of the GRPO variants on off-policy samples from another model.

A tiny-s learner trains for N rounds on its own groups plus groups sampled by a frozen tiny-m (another
architecture and size, same tokenizer), once per variant, with the same seeds, so every variant sees the
same prompts and the same external samples. Prints held-out accuracy before/after, filtered sequences,
mean external ratio and seconds per round, and the accuracy gain relative to on-policy training alone.

    python benchmarks/offpolicy.py --rounds 30 --json results/offpolicy.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from swarm_node.config import NodeConfig
from swarm_node.node.grpo_node import GRPONode
from swarm_node.training.ftis import VARIANTS


def cfg_for(model: str, variant: str, seed: int, prompts: int, eval_n: int) -> NodeConfig:
    return NodeConfig.model_validate({
        "seed": seed,
        "model": {"path": model},
        "task": {"name": "arithmetic", "prompts_per_round": prompts, "eval_n": eval_n},
        "generation": {"num_generations": 8, "max_new_tokens": 6},
        "training": {"variant": variant},
    })


def run_variant(variant: str, args: argparse.Namespace, workdir: Path) -> dict:
    torch.manual_seed(0)
    source = GRPONode(cfg_for(args.source, "on_policy", 7, args.prompts, args.eval_n), workdir / f"src-{variant}")
    learner = GRPONode(cfg_for(args.learner, variant, 1, args.prompts, args.eval_n), workdir / variant)
    learner.external_source = lambda r: source.generate(r).train_groups(source=args.source)
    before = learner.evaluate()["accuracy"]
    t0 = time.perf_counter()
    rows = [learner.run_round() for _ in range(args.rounds)]
    secs = (time.perf_counter() - t0) / args.rounds
    after = learner.evaluate()["accuracy"]
    finite = all(torch.isfinite(p).all() for p in learner.loaded.model.parameters())
    ratios = [r["mean_ratio_external"] for r in rows if r["mean_ratio_external"] is not None]
    return {
        "variant": variant,
        "acc_before": before,
        "acc_after": after,
        "reward_last5": sum(r["reward_mean"] for r in rows[-5:]) / 5,
        "filtered_external": sum(r["filtered_external"] for r in rows),
        "external_groups": sum(r["external_groups"] for r in rows),
        "mean_ratio_external": sum(ratios) / len(ratios) if ratios else None,
        "params_finite": bool(finite),
        "s_per_round": secs,
        "gen_s": sum(r["gen_s"] for r in rows) / len(rows),
        "train_s": sum(r["train_s"] for r in rows) / len(rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--eval-n", type=int, default=400)
    ap.add_argument("--learner", default="tiny-s")
    ap.add_argument("--source", default="tiny-m")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--workdir", type=Path, default=Path("runs/bench-offpolicy"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = [run_variant(v, args, args.workdir) for v in args.variants]
    base = next((r for r in results if r["variant"] == "on_policy"), None)
    print(f"\n{args.learner} learner + {args.source} external samples, {args.rounds} rounds, "
          f"{args.prompts} own prompts x 8 per round, held-out n={args.eval_n}\n")
    print(f"{'variant':10s} {'acc before':>10s} {'acc after':>10s} {'gain':>7s} {'vs on_policy':>12s} "
          f"{'filtered':>9s} {'ext ratio':>9s} {'gen s':>6s} {'train s':>7s} finite")
    for r in results:
        gain = r["acc_after"] - r["acc_before"]
        rel = "" if base is None else f"{gain - (base['acc_after'] - base['acc_before']):+.3f}"
        ratio = "-" if r["mean_ratio_external"] is None else f"{r['mean_ratio_external']:.2f}"
        print(f"{r['variant']:10s} {r['acc_before']:10.3f} {r['acc_after']:10.3f} {gain:+7.3f} {rel:>12s} "
              f"{r['filtered_external']:9d} {ratio:>9s} {r['gen_s']:6.2f} {r['train_s']:7.2f} {r['params_finite']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                        indent=2))


if __name__ == "__main__":
    main()
