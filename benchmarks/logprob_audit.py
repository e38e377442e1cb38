"""False positives and detection of the behaviour log-prob audits, on real tiny models (threat: fabricated
behaviour log-probs, docs/security.md "The log-prob audit, and what it costs").

On real tiny models, a tiny-s judge recomputes the log-probs of batches sampled by tiny-s itself (same
model), by tiny-m (an honest but different model: other size and architecture, same tokenizer), and by a
tiny-m attacker that lowers its claimed log-probs by DELTA on positive-advantage completions (what buys the F-TIS cap's 2x),
(or on every completion), and applies grpo.defences.LogprobAudit (per batch) and SkewAudit (per peer, running
over rounds) to each. Prints, per case: batches, rejected, the mean statistic
(mean capped weight) and the mean threshold. Log-probs are put on the wire's 1/64 grid first.

    python -m benchmarks.logprob_audit --rounds 30 [--prompts 8] [--seeds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from swarm_node.config import NodeConfig
from swarm_node.grpo.round import GRPONode
from swarm_node.training.groups import TrainGroup
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json
from tooling.benchmark_nodes import node_config


def cfg_for(model: str, seed: int, prompts: int) -> NodeConfig:
    return node_config(model, seed, prompts=prompts, eval_n=16, max_new_tokens=8)


def on_wire(groups: list[TrainGroup], delta: float = 0.0, everywhere: bool = False) -> list[TrainGroup]:
    """Quantize claimed log-probs to 1/64; with delta > 0, lower them on positive-advantage completions
    (or on every completion)."""
    out = []
    for g in groups:
        r = np.asarray(g.rewards, np.float64)
        lps = []
        for lp, rew in zip(g.behaviour_logprobs, r, strict=True):
            lp = np.asarray(lp, np.float64) - (delta if delta and (everywhere or rew > r.mean()) else 0.0)
            lps.append((np.rint(lp * 64) / 64).astype(np.float32))
        out.append(TrainGroup(prompt_ids=g.prompt_ids, completions=g.completions, behaviour_logprobs=lps,
                              rewards=g.rewards, source="peer"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--deltas", type=float, nargs="+", default=[0.7, 3.0])
    add_run_args(ap, seeds=1, first_seed=1, quick="5 rounds")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    torch.set_num_threads(1)
    rounds = 5 if args.quick else args.rounds
    cases: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            judge = GRPONode(cfg_for("tiny-s", seed, args.prompts), Path(tmp) / f"judge{seed}")
            other = GRPONode(cfg_for("tiny-m", seed + 100, args.prompts), Path(tmp) / f"other{seed}")
            for r in range(1, rounds + 1):
                sampled = {"tiny-s (same model)": judge.generate(r).train_groups(), "tiny-m (honest, other model)":
                           other.generate(r + 10_000).train_groups()}
                batches = {name: on_wire(g) for name, g in sampled.items()}
                for d in args.deltas:
                    honest = sampled["tiny-m (honest, other model)"]
                    batches[f"attacker -{d}, positive adv."] = on_wire(honest, d)
                    batches[f"attacker -{d}, every completion"] = on_wire(honest, d, everywhere=True)
                for name, groups in batches.items():
                    lps = judge.trainer.completion_logprobs(groups)
                    ok, stat, limit = judge.admission.audit.judge(groups, lps)
                    # each case is one peer to the per-peer skew audit (its running statistics span rounds)
                    skew_ok, _, _ = judge.admission.skew.judge(f"{seed}:{name}", groups, lps)
                    c = cases.setdefault(name, {"batches": 0, "rejected": 0, "skew_rejected": 0, "either": 0,
                                                "stats": [], "limits": [], "gaps": []})
                    c["batches"] += 1
                    c["rejected"] += int(not ok)
                    c["skew_rejected"] += int(not skew_ok)
                    c["either"] += int(not (ok and skew_ok))
                    c["stats"].append(stat)
                    c["limits"].append(limit)
                    c["gaps"].extend(judge.admission.skew.gaps(groups, lps))
    print(f"{'case':<32} {'batches':>8} {'mean-test':>9} {'skew-test':>9} {'either':>7} {'mean stat':>10} "
          f"{'max stat':>9} {'threshold':>10} {'gap mean':>9} {'gap sd':>7}")
    summary = {}
    for name, c in cases.items():
        summary[name] = {"batches": c["batches"], "rejected": c["rejected"], "skew_rejected": c["skew_rejected"],
                         "either": c["either"], "mean_stat": float(np.mean(c["stats"])),
                         "max_stat": float(np.max(c["stats"])), "mean_threshold": float(np.mean(c["limits"])),
                         "gap_mean": float(np.mean(c["gaps"])) if c["gaps"] else float("nan"),
                         "gap_sd": float(np.std(c["gaps"])) if c["gaps"] else float("nan")}
        s = summary[name]
        print(f"{name:<32} {s['batches']:>8} {s['rejected']:>9} {s['skew_rejected']:>9} {s['either']:>7} "
              f"{s['mean_stat']:>10.3f} {s['max_stat']:>9.3f} {s['mean_threshold']:>10.3f} {s['gap_mean']:>9.3f} "
              f"{s['gap_sd']:>7.3f}")
    write_json(args.json, summary, args)


if __name__ == "__main__":
    main()
