"""Byzantine DPO neighbours: 8 nodes on a ring and an exponential graph, 0, 1 or 2 hostile, plain vs robust.

The swarm of benchmarks/dpo_topology.py (8 in-process tiny-Llama DPO nodes, common initial weights, node i
holding synthetic user i mod 4, one local DPO step per round) averages through the node's own
`mixing.gossip_step`, with `RobustAverager` (dpo/robust.py: replay and outlier refusal, ClippedGossip)
or without it (plain averaging, `dpo.aggregation: mean`). Every node is built from one DPOConfig as
DPONode builds it: under the robust rule the graph is widened to `dpo.min_neighbours` (the ring gets its
second neighbours; `--min-neighbours 0` keeps it), and `Bypass` routes around missing neighbours.
Hostile nodes (tooling/dpo_adversary.py) train and average like the others but send their neighbours
corrupted, finite parameters through the real float16 payload codec; in the 2-attacker runs they are nodes 0 and 3 (every honest node has an honest
neighbour on the ring), with 1 attacker node 0. For every graph, number of attackers, mode and rule it
reports, over the seeds:

- the honest nodes' held-out preference accuracy (the mixture of all users) after the last round, mean
  over nodes, and the worst honest node's difference from the same seed's no-attack run of the same rule
  (paired per held-out pair, `runs.stats.paired_difference`: mean over seeds +- SE, and its verdict);
- the honest nodes' consensus error sqrt(mean_i ||x_i - x_bar||^2) after the last round;
- what the robust rule refused (by reason) and clipped, per honest node and round.

With no attacker it also measures the cost of the robust rule: accuracy and consensus error against plain
(paired), and the per-step contraction of pure averaging (random vectors, no training, through
the same bytes and functions, steps 6-12): "consensus rate" = 1 - measured rho.

    python -m benchmarks.dpo_byzantine --seeds 3 --json docs/data/dpo_byzantine.json --png docs/data/dpo_byzantine.png
    python -m benchmarks.dpo_byzantine --quick
"""

from __future__ import annotations

import argparse
import logging
import math
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from benchmarks.dpo_topology import Swarm, consensus_error
from swarm_node import dpo as G
from swarm_node.config import DPOConfig
from swarm_node.dpo import topology
from swarm_node.dpo.bypass import Bypass
from swarm_node.dpo.neighbours import gossip_graph
from swarm_node.dpo.robust import RobustAverager
from swarm_node.runs.stats import fmt_ms
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.byzantine_summary import ABSENT, summarize
from tooling.dpo_adversary import MODES, OMNISCIENT, HostileNeighbour, View, recipient

ROOT = Path(__file__).resolve().parents[1]

GRAPHS = ("ring", "exponential")
RULES = ("plain", "robust")
ATTACKERS = {0: [], 1: [0], 2: [0, 3]}
COMPRESSION = "float16"
BYPASS_AFTER = DPOConfig().bypass_after  # the node's defaults
STALL_RATIO = DPOConfig().stall_ratio
OUTLIER_FACTOR = DPOConfig().outlier_factor
CLIP_FARTHEST = DPOConfig().clip_farthest
MIN_NEIGHBOURS = DPOConfig().min_neighbours


def node_config(rule: str, **settings: float) -> DPOConfig:
    """The DPO section of every honest node under `rule` (robust: dpo.aggregation clipped)."""
    return DPOConfig(aggregation="clipped" if rule == "robust" else "mean", **settings)


def run(graph: str, rule: str, byz: list[int], mode: str | None, seed: int, rounds: int, n: int = 8,
        bypass_after: int = BYPASS_AFTER, outlier_factor: float = OUTLIER_FACTOR,
        clip_farthest: int = CLIP_FARTHEST, eval_every: int = 0, stall_ratio: float = STALL_RATIO,
        min_neighbours: int = MIN_NEIGHBOURS) -> dict:
    """One swarm for `rounds` rounds; the honest nodes' accuracy, hits, consensus error and refusals.
    With `eval_every`, the honest nodes are also evaluated every that many rounds (`at`: round -> nodes)."""
    sw = Swarm(n, 4, seed, lr=3e-3, pairs=128, heldout=200)
    # every honest node is built as DPONode builds it in gossip mode, from the same config
    d = node_config(rule, bypass_after=bypass_after, stall_ratio=stall_ratio, clip_farthest=clip_farthest,
                    outlier_factor=outlier_factor, min_neighbours=min_neighbours)
    adj = gossip_graph(d, n, graph)  # every node derives the same graph (widened under the robust rule)
    honest = set(range(n)) - set(byz)
    initial = sw.params()[0]
    robust = {i: RobustAverager.from_config(d) for i in honest} if rule == "robust" else {}
    bypass = {i: Bypass.from_config(d) for i in honest}
    for r in robust.values():  # as DPONode does: our own first update is measured from the initial model
        r.averaged(initial)
    rejects = {i: G.RejectCounter() for i in range(n)}
    hostile = {b: HostileNeighbour(mode, 1000 * seed + b) for b in byz} if mode in MODES else {}
    clipped, consensus, routed, stalls = 0, [], 0, 0
    last_ratio: dict[int, float | None] = {}  # each honest node's pull ratio last round (a paced attacker steers by it)
    at: dict[int, dict[int, dict]] = {}
    for r in range(rounds):
        for t in sw.trainers:
            t.local_steps(1)
        xs = sw.params()
        blobs = {p: G.encode_params(x, sw.arch, COMPRESSION) for p, x in zip(sw.ids, xs, strict=True)}
        # each honest node's graph this round: the ring plus its links around neighbours it routes around
        graphs = {i: bypass[i].adjacency(adj, sw.ids, sw.ids[i]) if i in honest else adj for i in range(n)}
        routed += sum(len(bypass[i].routed_around()) for i in honest)
        sent: dict[tuple[int, int], bytes] = {}
        for b in byz:
            nbrs = [i for i in sorted(honest) if graphs[i][i, b]]  # everyone who fetches from it
            recipients = {}
            for i in nbrs if mode in OMNISCIENT else []:
                w = topology.mixing_matrix_from_adjacency(graphs[i])  # the weights node i gives its neighbours
                weight = float(w[i, b]) * sum(1 for k in byz if graphs[i][i, k])  # shared by colluders
                recipients[sw.ids[i]] = recipient(xs, w, i, honest, weight, last_ratio.get(i))
            view = View(r, xs[b], {sw.ids[j]: xs[j] for j in np.flatnonzero(adj[b])}, initial, recipients)
            for rec, params in (hostile[b].send(view, [sw.ids[i] for i in nbrs]) if b in hostile else {}).items():
                sent[(b, sw.ids.index(rec))] = G.encode_params(params, sw.arch, COMPRESSION)
        new = []
        for i, p in enumerate(sw.ids):
            # hostile nodes average honestly with everyone's true parameters (colluders share theirs)
            received = {q: (sent.get((j, i)) if j in byz else blobs[q]) if i in honest else blobs[q]
                        for j, q in enumerate(sw.ids)}
            res = G.gossip_step(p, blobs[p], received, sw.ids, graphs[i], sw.shapes, sw.arch, COMPRESSION,
                                rejects[i], robust=robust.get(i))
            if i in honest:
                stalls += bypass[i].observe(res.present, res.missing, res.pull_ratio)
                last_ratio[i] = res.pull_ratio
            clipped += len(res.clipped)
            new.append(res.params)
        for m, x in zip(sw.models, new, strict=True):
            G.set_params(m, x)
        consensus.append(consensus_error([new[i] for i in sorted(honest)]))
        if eval_every and (r + 1) % eval_every == 0 and r + 1 < rounds:
            at[r + 1] = _evaluate(sw, honest)
    per_node = at[rounds] = _evaluate(sw, honest)
    refused = Counter()
    for i in honest:
        refused.update(rejects[i].counts)
    node_rounds = len(honest) * rounds
    return {"graph": graph, "rule": rule, "byzantine": byz, "mode": mode or "none", "seed": seed,
            "acc": float(np.mean([v["acc"] for v in per_node.values()])), "nodes": per_node,
            "consensus": consensus, "refused": dict(refused), "refused_per_node_round": sum(refused.values()) / node_rounds,
            "clipped_per_node_round": clipped / node_rounds, "routed_around_per_node_round": routed / node_rounds,
            "stalls_per_node_round": stalls / node_rounds, "bypass_after": bypass_after, "stall_ratio": stall_ratio,
            "at": at}


def _evaluate(sw: Swarm, honest: set[int]) -> dict[int, dict]:
    """Every honest node's held-out preference accuracy and per-pair hits (margin > 0)."""
    out = {}
    for i in sorted(honest):
        _loss, margin = sw.held.scores(sw.models[i])
        hits = (margin > 0).tolist()
        out[i] = {"acc": float(np.mean(hits)), "hits": hits}
    return out


def contraction(graph: str, rule: str, min_neighbours: int = 0, n: int = 8, steps: int = 12,
                seed: int = 0) -> tuple[float, float]:
    """Measured per-step shrink of the consensus error of pure averaging (random vectors, no training),
    geometric mean over the last half of `steps` (more steps would reach float32's noise floor on fast
    graphs), through the real bytes and gossip_step; and the fetches per node and round (mean degree)."""
    g = torch.Generator().manual_seed(seed)
    states = [[torch.randn(17, 5, generator=g), torch.randn(40, generator=g)] for _ in range(n)]
    ids = [f"peer-{i}" for i in range(n)]
    adj = gossip_graph(node_config(rule, min_neighbours=min_neighbours), n, graph)
    shapes = [t.shape for t in states[0]]
    robust = [RobustAverager() if rule == "robust" else None for _ in range(n)]
    errs = []
    for _ in range(steps):
        errs.append(consensus_error(states))
        blobs = {p: G.encode_params(s, "f" * 16, "none") for p, s in zip(ids, states, strict=True)}
        states = [G.gossip_step(p, blobs[p], blobs, ids, adj, shapes, "f" * 16, "none", robust=robust[i]).params
                  for i, p in enumerate(ids)]
    tail = errs[steps // 2:]
    return float((tail[-1] / tail[0]) ** (1.0 / (len(tail) - 1))), float(adj.sum(axis=1).mean())


def print_table(summary: dict, rates: dict, seeds: list[int], rounds: int) -> None:
    print(f"\n8 nodes, 4 users, {rounds} rounds, 1 local step, float16, seeds {seeds}; accuracy = honest nodes' "
          "mean held-out preference accuracy (mean +- std over seeds); worst = the honest node that lost most "
          "against the same rule's no-attack run (paired, mean over seeds +- SE)\n")
    print(f"{'graph':11s} {'f':>1s} {'mode':10s} {'rule':6s} {'accuracy':>15s} {'worst node vs no attack':>26s} "
          f"{'consensus err':>15s} {'refused/nd/rd':>13s} {'clipped/nd/rd':>13s}")
    for row in summary["rows"]:
        w = row.get("worst_node")
        worst = f"{100 * w['diff']:+6.1f} +- {100 * w['se']:.1f} pt (n{w['node']})" if w else "-"
        print(f"{row['graph']:11s} {row['attackers']:1d} {row['mode']:10s} {row['rule']:6s} {fmt_ms(row['acc']):>15s} "
              f"{worst:>26s} {fmt_ms(row['consensus'], '.3f'):>15s} {row['refused_per_node_round']:13.2f} "
              f"{row['clipped_per_node_round']:13.2f}")
    print("\nrobust vs the same rule with the hostile slots silent ('absent'), mean honest accuracy, paired:")
    for row in summary["rows"]:
        if "vs_absent" in row:
            a = row["vs_absent"]
            print(f"{row['graph']:11s} {row['attackers']:1d} {row['mode']:10s} {row['rule']:6s} "
                  f"{100 * a['diff']:+6.1f} +- {100 * a['se']:.1f} pt ({a['verdict']})")
    by_round = [r for r in summary["rows"] if len(r.get("worst_node_by_round", {})) > 1]
    if by_round:
        ts = sorted(by_round[0]["worst_node_by_round"])
        print("\nworst honest node vs no attack by round (points, paired, mean over seeds +- SE):")
        print(f"{'graph':11s} {'f':>1s} {'mode':10s} {'rule':6s} " + " ".join(f"{'round ' + str(t):>15s}" for t in ts))
        for row in by_round:
            cells = [row["worst_node_by_round"].get(t) for t in ts]
            print(f"{row['graph']:11s} {row['attackers']:1d} {row['mode']:10s} {row['rule']:6s} " + " ".join(
                f"{100 * c['diff']:+7.1f} +- {100 * c['se']:4.1f}" if c else f"{'-':>15s}" for c in cells))
    print("\nno attacker: the cost of the robust rule")
    for graph, c in summary["no_attack_cost"].items():
        print(f"{graph:11s} honest accuracy robust - plain {100 * c['acc_diff']:+.1f} +- {100 * c['se']:.1f} pt "
              f"({c['verdict']}); final consensus error robust / plain {c['consensus_ratio']:.2f}")
    for graph in rates:
        r = rates[graph]
        print(f"{graph:11s} pure averaging rho: plain {r['plain'][0]:.4f}, robust {r['robust'][0]:.4f} "
              f"({r['robust_same_graph'][0]:.4f} without widening); consensus rate (1 - rho) robust / plain = "
              f"{(1 - r['robust'][0]) / (1 - r['plain'][0]):.3f} "
              f"({(1 - r['robust_same_graph'][0]) / (1 - r['plain'][0]):.3f} without widening); "
              f"fetches per node and round: plain {r['plain'][1]:.1f}, robust {r['robust'][1]:.1f}")


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fewest = min((r["attackers"] for r in summary["rows"] if r["attackers"] > 0), default=1)
    rows = [r for r in summary["rows"] if r["attackers"] == fewest]  # a run of --attackers 2 alone plots those
    graphs = sorted({r["graph"] for r in rows})
    fig, axes = plt.subplots(1, len(graphs), figsize=(6 * len(graphs), 4), squeeze=False)
    for ax, graph in zip(axes[0], graphs, strict=True):
        modes = sorted({r["mode"] for r in rows if r["graph"] == graph})
        for k, rule in enumerate(RULES):
            vals = [next((r["acc"] for r in rows if r["graph"] == graph and r["mode"] == m and r["rule"] == rule),
                         (math.nan, 0.0)) for m in modes]
            ax.bar(np.arange(len(modes)) + 0.4 * k, [v[0] for v in vals], 0.4, yerr=[v[1] for v in vals], label=rule)
        for r in summary["rows"]:
            if r["graph"] == graph and r["attackers"] == 0:
                ax.axhline(r["acc"][0], ls="--" if r["rule"] == "plain" else ":", color="k", lw=1)
        ax.set_xticks(np.arange(len(modes)) + 0.2, modes, rotation=30)
        ax.set_title(f"{graph}: 1 hostile node of 8 (dashed: no attack)")
        ax.set_ylabel("honest held-out preference accuracy")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=3, quick_seeds=1, quick="the ring, modes scaled and alie, 1 attacker, 6 rounds, 1 seed")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=topology.GRAPHS)
    ap.add_argument("--modes", nargs="+", default=[*MODES, ABSENT], choices=[*MODES, ABSENT])
    ap.add_argument("--attackers", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    ap.add_argument("--bypass-after", type=int, default=BYPASS_AFTER,
                    help="dpo.bypass_after of every honest node (0: never route around a missing neighbour)")
    ap.add_argument("--stall-ratio", type=float, default=STALL_RATIO,
                    help="dpo.stall_ratio of every honest node under the robust rule (0: never widen a stalled node)")
    ap.add_argument("--outlier-factor", type=float, default=OUTLIER_FACTOR,
                    help="dpo.outlier_factor of every honest node under the robust rule")
    ap.add_argument("--clip-farthest", type=int, default=CLIP_FARTHEST,
                    help="dpo.clip_farthest of every honest node under the robust rule")
    ap.add_argument("--min-neighbours", type=int, default=MIN_NEIGHBOURS,
                    help="dpo.min_neighbours of every node under the robust rule (0: gossip on the graph as it is)")
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES,
                    help="averaging rules to run (the no-attack cost and 'what plain loses' need both)")
    ap.add_argument("--eval-every", type=int, default=20,
                    help="also evaluate the honest nodes every this many rounds (the by-round table; 0: only the last)")
    ap.add_argument("--png", type=Path, default=None, help="also plot the summary here")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds, args.graphs, args.modes, args.attackers = 6, ["ring"], ["scaled", "alie"], [1]
    torch.set_num_threads(1)  # tiny models: one thread is faster than two busy ones
    logging.getLogger("swarm_node.dpo.mixing").setLevel(logging.ERROR)  # one refusal line per node and round
    t0 = time.perf_counter()
    # the code that runs is the code at the start: a commit made while it runs must not be recorded
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    plan = [(g, rule, [], None) for g in args.graphs for rule in args.rules]
    plan += [(g, rule, ATTACKERS[f], m) for g in args.graphs for f in args.attackers for m in args.modes
             for rule in args.rules]
    results = []
    for graph, rule, byz, mode in plan:
        for seed in seeds:
            res = run(graph, rule, byz, mode, seed, args.rounds, bypass_after=args.bypass_after,
                      outlier_factor=args.outlier_factor, clip_farthest=args.clip_farthest, eval_every=args.eval_every,
                      stall_ratio=args.stall_ratio, min_neighbours=args.min_neighbours)
            results.append(res)
            print(f"[{time.perf_counter() - t0:6.0f}s] {graph:11s} f={len(byz)} {mode or 'none':10s} {rule:6s} seed {seed}: "
                  f"honest acc {res['acc']:.3f}, consensus {res['consensus'][-1]:.3f}, refused {res['refused']}, "
                  f"clipped {res['clipped_per_node_round']:.2f}/node/round, "
                  f"routed around {res['routed_around_per_node_round']:.2f}/node/round, "
                  f"stalls {res['stalls_per_node_round']:.3f}/node/round", flush=True)
    rates = {g: {"plain": contraction(g, "plain"), "robust": contraction(g, "robust", args.min_neighbours),
                 "robust_same_graph": contraction(g, "robust")} for g in args.graphs} \
        if set(args.rules) == set(RULES) else {}
    summary = summarize(results, seeds)
    print(f"\ndpo.bypass_after {args.bypass_after}, dpo.outlier_factor {args.outlier_factor:g}, "
          f"dpo.clip_farthest {args.clip_farthest}, dpo.stall_ratio {args.stall_ratio:g}")
    print_table(summary, rates, seeds, args.rounds)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        slim = [{k: v for k, v in r.items() if k not in ("nodes", "at")}
                | {"node_acc": {i: v["acc"] for i, v in r["nodes"].items()},
                   "node_acc_by_round": {t: {i: v["acc"] for i, v in nodes.items()} for t, nodes in r["at"].items()}}
                for r in results]
        write_json(args.json, {"args": public_args(args), "commit": commit, "seeds": seeds, "contraction": rates,
                               "summary": summary, "runs": slim}, args)
    if args.png:
        plot(summary, args.png)


if __name__ == "__main__":
    main()
