"""A learner trained on its own samples plus those of a frozen model, per arm and seed, paired on one eval set.

Shared by benchmarks/offpolicy.py (the loss variants) and benchmarks/g_ablation.py (F-TIS's threshold g): the
learner (tiny-s by default) samples its own groups every round and also gets groups that a frozen source (tiny-m:
another architecture and size) sampled for the same round, so the external samples are truly off-policy. For
one seed every arm sees the same prompts and the same source, and is scored on the same held-out problems, so
differences between arms are paired (swarm_node/runs/stats.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from swarm_node.grpo.round import GRPONode
from swarm_node.runs.stats import mean_std, paired_difference
from tooling.benchmark_nodes import grpo_node, heldout_score, node_config


def node(model: str, training: dict, seed: int, args: argparse.Namespace, workdir: Path) -> GRPONode:
    cfg = node_config(model, seed, prompts=args.prompts, eval_n=args.eval_n, training=training)
    return grpo_node(cfg, workdir)


def run_learner(training: dict, seed: int, args: argparse.Namespace) -> dict:
    """args.rounds rounds of the learner under `training` beside a frozen args.source; what it ends at."""
    with tempfile.TemporaryDirectory() as tmp:
        source = node(args.source, {"variant": "on_policy"}, 1000 + seed, args, Path(tmp) / "src")
        learner = node(args.learner, training, seed, args, Path(tmp) / "learner")
        learner.external_source = lambda r: source.generate(r).train_groups(source=args.source)
        rows = [learner.run_round() for _ in range(args.rounds)]
        end = heldout_score(learner, "id", args.eval_n).hits
        finite = all(torch.isfinite(p).all() for p in learner.loaded.model.parameters())
    external = sum(r["external_groups"] for r in rows) * 8
    ratios = [r["mean_ratio_external"] for r in rows if r.get("mean_ratio_external") is not None]
    return {"seed": seed, "acc": float(np.mean(end)), "hits": end,
            "filtered": sum(r["filtered_external"] for r in rows), "external_sequences": external,
            "filtered_share": sum(r["filtered_external"] for r in rows) / external if external else None,
            "mean_ratio_external": float(np.mean(ratios)) if ratios else None, "params_finite": bool(finite)}


def paired_table(runs: list[dict], key: str, base_value: object) -> list[dict]:
    """Per value of runs[key]: accuracy and filtered share (mean +- std over seeds), and the difference against
    the base arm of the same seeds, paired per problem, with its SE and 2-SE verdict."""
    base = {r["seed"]: r for r in runs if r[key] == base_value}
    table = []
    for value in dict.fromkeys(r[key] for r in runs):  # first-seen order
        rows = [r for r in runs if r[key] == value]
        entry = {key: value, "seeds": sorted(r["seed"] for r in rows), "acc": mean_std([r["acc"] for r in rows]),
                 "filtered_share": mean_std([r["filtered_share"] for r in rows]),
                 "mean_ratio_external": mean_std([r.get("mean_ratio_external") for r in rows]),
                 "params_finite": all(r.get("params_finite", True) for r in rows)}
        paired = [(r, base[r["seed"]]) for r in rows if r["seed"] in base]
        if value != base_value and paired:
            d, se, v = paired_difference(paired, "acc", "hits")
            entry.update(diff=d, se=se, verdict=v)
        else:
            entry.update(diff=float("nan"), se=float("nan"), verdict="-")
        table.append(entry)
    return table
