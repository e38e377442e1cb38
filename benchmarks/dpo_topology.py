"""Decentralized DPO on five graphs, side by side: consensus, accuracy, contraction vs the spectral gap, bytes.

8 in-process DPO nodes (a tiny Llama each, the same initial weights), 4 users with different tastes (node
i has user i mod 4, so graph neighbours differ in taste; non-IID), one local DPO step per round, then one
gossip average through the same functions the networked node runs (swarm_node/dpo/mixing.py). Per graph it reports:

- consensus error sqrt(mean_i ||x_i - x_bar||^2) and the mean held-out preference accuracy of the nodes
  (the mixture of all users) per round;
- the measured per-step contraction of pure averaging (random vectors, no training) against the
  prediction rho = second-largest eigenvalue modulus of W (1 - spectral gap);
- bytes sent per node per round with float16 and uint8 payloads;
- CHOCO-Gossip (top-k compressed changes with error feedback, tooling/choco.py) against plain
  float16 averaging on the same graph: cumulative bytes per node until the mean accuracy first reaches
  95% of plain float16's final accuracy.

Results are mean +- std over seeds (model init and data). Run from the project root:

    python -m benchmarks.dpo_topology --seeds 3 --json dpo_topology.json
    python -m benchmarks.dpo_topology --quick
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from swarm_node import dpo
from swarm_node.dpo import topology
from swarm_node.models.factory import Preset, build_model, build_tokenizer
from swarm_node.runs.stats import fmt_ms as fmt
from swarm_node.runs.stats import mean_std
from swarm_node.tasks.preferences import SyntheticPreferences
from swarm_node.training.dpo import DPOTrainer, HeldOut
from swarm_node.training.params import trainable_named
from tooling import choco
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

GRAPHS = ("path", "ring", "torus", "exponential", "complete")


def measured_contraction(w: np.ndarray, steps: int = 30, dim: int = 64, seed: int = 0) -> float:
    """Geometric-mean per-step shrink of ||X - x_bar|| under X <- W X, over the last half of `steps`."""
    x = np.random.default_rng(seed).standard_normal((w.shape[0], dim))
    errs = []
    for _ in range(steps):
        errs.append(np.linalg.norm(x - x.mean(axis=0)))
        x = w @ x
    tail = errs[steps // 2:]
    return float((tail[-1] / tail[0]) ** (1.0 / (len(tail) - 1))) if tail[0] > 0 else 0.0


def consensus_error(states: list[list[torch.Tensor]]) -> float:
    flat = torch.stack([torch.cat([t.reshape(-1) for t in s]) for s in states])
    return float(((flat - flat.mean(dim=0)) ** 2).sum(dim=1).mean().sqrt())


class Swarm:
    """n DPO nodes in one process with a common initial model; node i holds user (i mod users)'s pairs."""

    def __init__(self, n: int, users: int, seed: int, lr: float, pairs: int, heldout: int) -> None:
        torch.manual_seed(seed)
        self.tok = build_tokenizer()
        pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=lr, lr_lora=lr)
        base = build_model(pre, len(self.tok), self.tok.pad_token_id, self.tok.eos_token_id, seed)
        task = SyntheticPreferences(users)
        self.ids = [f"peer-{i}" for i in range(n)]
        self.models = []
        for _ in range(n):
            m = build_model(pre, len(self.tok), self.tok.pad_token_id, self.tok.eos_token_id, seed)
            m.load_state_dict(base.state_dict())
            self.models.append(m)
        # users interleaved around the graph (node i has user i mod users), each node its own sample of pairs
        self.trainers = [DPOTrainer(m, self.tok, task.user_pairs(i % users, pairs, seed=1000 * seed + i), lr=lr,
                                    batch_size=16, seed=seed + i) for i, m in enumerate(self.models)]
        self.held = HeldOut(base, self.tok, task.heldout_pairs(heldout, seed=seed + 10_000))
        self.arch = dpo.arch_fingerprint(base)
        self.shapes = [p.shape for _, p in trainable_named(base)]

    def accuracy(self) -> float:
        return float(np.mean([self.held.evaluate(m)["heldout_pref_acc"] for m in self.models]))

    def params(self) -> list[list[torch.Tensor]]:
        return [dpo.get_params(m) for m in self.models]


def run_plain(sw: Swarm, graph: str, compression: str, rounds: int, eval_every: int) -> dict:
    adj = topology.adjacency(graph, len(sw.ids))
    degree = adj.sum(axis=1)
    curve, errors, sent = [], [], 0.0
    for r in range(rounds):
        for t in sw.trainers:
            t.local_steps(1)
        blobs = {p: dpo.encode_params(dpo.get_params(m), sw.arch, compression)
                 for p, m in zip(sw.ids, sw.models, strict=True)}
        sent += float(np.mean([degree[i] * len(blobs[p]) for i, p in enumerate(sw.ids)]))
        for p, m in zip(sw.ids, sw.models, strict=True):
            res = dpo.gossip_step(p, blobs[p], blobs, sw.ids, adj, sw.shapes, sw.arch, compression)
            dpo.set_params(m, res.params)
        errors.append(consensus_error(sw.params()))
        if (r + 1) % eval_every == 0 or r == rounds - 1:
            curve.append((r + 1, sw.accuracy(), sent))
    return {"curve": curve, "consensus": errors, "bytes_per_node_round": sent / rounds}


def run_choco(sw: Swarm, graph: str, rounds: int, eval_every: int, fraction: float, gamma: float) -> dict:
    adj = topology.adjacency(graph, len(sw.ids))
    degree = adj.sum(axis=1)
    public = sw.params()  # x_hat_i starts at the common initial model, which every node already has
    curve, errors, sent = [], [], 0.0
    for r in range(rounds):
        for t in sw.trainers:
            t.local_steps(1)
        xs = sw.params()
        msgs = [choco.compress(x, h, fraction) for x, h in zip(xs, public, strict=True)]
        public = [choco.apply(h, q) for h, q in zip(public, msgs, strict=True)]
        sent += float(np.mean([degree[i] * choco.message_bytes(q) for i, q in enumerate(msgs)]))
        by_id = dict(zip(sw.ids, public, strict=True))
        for i, (p, m) in enumerate(zip(sw.ids, sw.models, strict=True)):
            weights = dpo.live_mixing_row(adj, sw.ids, p)
            dpo.set_params(m, choco.consensus_step(xs[i], public[i], by_id, weights, p, gamma))
        errors.append(consensus_error(sw.params()))
        if (r + 1) % eval_every == 0 or r == rounds - 1:
            curve.append((r + 1, sw.accuracy(), sent))
    return {"curve": curve, "consensus": errors, "bytes_per_node_round": sent / rounds}


def bytes_to_reach(curve: list[tuple[int, float, float]], target: float) -> float | None:
    return next((b for _, acc, b in curve if acc >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=3, quick_seeds=1, quick="ring and complete (CHOCO on the ring), 8 rounds, eval every 4")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=GRAPHS)
    ap.add_argument("--choco-graphs", nargs="+", default=["ring", "exponential"], choices=GRAPHS)
    ap.add_argument("--choco-fraction", type=float, default=0.05, help="top-k share of entries sent")
    ap.add_argument("--choco-gamma", type=float, default=0.5, help="consensus step size")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds, args.graphs, args.choco_graphs, args.eval_every = 8, ["ring", "complete"], ["ring"], 4
    torch.set_num_threads(1)  # tiny models: one thread is faster than two busy ones
    t0 = time.perf_counter()
    rows: dict[str, dict] = {}
    for graph in args.graphs:
        w = topology.mixing_matrix(graph, args.nodes)
        row = rows[graph] = {"rho_predicted": topology.second_eigenvalue_modulus(w),
                             "spectral_gap": topology.spectral_gap(w),
                             "rho_measured": measured_contraction(w), "runs": {}}
        methods = ["float16", "uint8"] + (["choco"] if graph in args.choco_graphs else [])
        for method in methods:
            row["runs"][method] = []
            for seed in seeds:
                sw = Swarm(args.nodes, 4, seed, lr=3e-3, pairs=128, heldout=200)
                if method == "choco":
                    res = run_choco(sw, graph, args.rounds, args.eval_every, args.choco_fraction, args.choco_gamma)
                else:
                    res = run_plain(sw, graph, method, args.rounds, args.eval_every)
                row["runs"][method].append(res)
                print(f"[{time.perf_counter() - t0:6.0f}s] {graph:11s} {method:7s} seed {seed}: final acc "
                      f"{res['curve'][-1][1]:.3f}, consensus {res['consensus'][-1]:.4f}, "
                      f"{res['bytes_per_node_round'] / 1024:.1f} KiB/node/round", flush=True)

    print(f"\n{args.nodes} nodes, 4 users, {args.rounds} rounds, 1 local step, seeds {seeds}; mean +- std over seeds\n")
    print(f"{'graph':11s} {'gap':>6s} {'rho pred':>8s} {'rho meas':>8s} {'acc fp16':>16s} {'acc uint8':>16s} "
          f"{'consensus fp16':>18s} {'KiB/node/rnd fp16':>18s} {'uint8/fp16 bytes':>16s}")
    summary: dict[str, dict] = {}
    for graph, row in rows.items():
        fp16, u8 = row["runs"]["float16"], row["runs"]["uint8"]
        acc16 = mean_std([r["curve"][-1][1] for r in fp16])
        acc8 = mean_std([r["curve"][-1][1] for r in u8])
        cons = mean_std([r["consensus"][-1] for r in fp16])
        b16 = mean_std([r["bytes_per_node_round"] for r in fp16])
        b8 = mean_std([r["bytes_per_node_round"] for r in u8])
        summary[graph] = {"spectral_gap": row["spectral_gap"], "rho_predicted": row["rho_predicted"],
                          "rho_measured": row["rho_measured"], "acc_float16": acc16, "acc_uint8": acc8,
                          "consensus_float16": cons, "bytes_per_node_round_float16": b16,
                          "bytes_per_node_round_uint8": b8}
        print(f"{graph:11s} {row['spectral_gap']:6.3f} {row['rho_predicted']:8.3f} {row['rho_measured']:8.3f} "
              f"{fmt(acc16):>16s} {fmt(acc8):>16s} {fmt(cons, '.4f'):>18s} {b16[0] / 1024:18.1f} "
              f"{b8[0] / b16[0]:16.2f}")
    choco_rows = [g for g in rows if "choco" in rows[g]["runs"]]
    if choco_rows:
        print(f"\nCHOCO-Gossip (top-k {100 * args.choco_fraction:.0f}%, gamma {args.choco_gamma:.2f}) vs plain "
              "float16: bytes per node to reach 95% of plain's final accuracy")
        print(f"{'graph':11s} {'target':>7s} {'acc choco':>16s} {'KiB fp16':>14s} {'KiB choco':>14s} {'ratio':>7s}")
        for graph in choco_rows:
            fp16, ch = rows[graph]["runs"]["float16"], rows[graph]["runs"]["choco"]
            reach16, reachc = [], []
            for a, b in zip(fp16, ch, strict=True):
                target = 0.95 * a["curve"][-1][1]
                reach16.append(bytes_to_reach(a["curve"], target))
                reachc.append(bytes_to_reach(b["curve"], target))
            r16, rc = mean_std(reach16), mean_std(reachc)
            reached = sum(x is not None for x in reachc)
            ratio = rc[0] / r16[0] if reached and not math.isnan(r16[0]) else float("nan")
            summary[graph]["choco"] = {"acc": mean_std([r["curve"][-1][1] for r in ch]), "bytes_to_target_fp16": r16,
                                       "bytes_to_target_choco": rc, "seeds_reaching_target": reached}
            print(f"{graph:11s} {0.95 * mean_std([a['curve'][-1][1] for a in fp16])[0]:7.3f} "
                  f"{fmt(mean_std([r['curve'][-1][1] for r in ch])):>16s} {r16[0] / 1024:14.1f} "
                  f"{rc[0] / 1024 if reached else float('nan'):14.1f} {ratio:7.3f}  ({reached}/{len(ch)} seeds reached)")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    write_json(args.json, {"args": public_args(args), "seeds": seeds, "summary": summary, "rows": rows}, args)


if __name__ == "__main__":
    main()
