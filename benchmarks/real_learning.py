"""Does SmolLM2-135M-Instruct learn with swarm-node, alone and in a 2-peer swarm (full + LoRA), with F-TIS and
with naive sharing? Held-out accuracy before and after, paired per problem, over seeds, with learning curves.

The two peers are exactly peers/smollm2-135m.yaml (full parameters) and peers/smollm2-135m-lora.yaml (LoRA on
q/k/v/o), with the swarm off and the round count and seed of this run. Arms, per seed:

  alone   each peer trains on its own samples only
  ftis    both peers train side by side in one process; every round each trains on its own samples plus the
          other's fresh samples of that round (what a 2-peer swarm exchanges, without the network), F-TIS
  naive   the same sharing with the plain GRPO loss on the partner's samples (no importance correction)

All arms of a seed draw the same prompts, and every model is scored on the same held-out problems with the
node's own evaluation (its PromptEncoder, so the chat template is applied), so differences are paired per
problem (swarm_node/runs/stats.py). Reported: each arm's gain over the start model (does it learn at all:
the acceptance), swarm against alone, F-TIS against naive; the time per round, measured; a PNG of the
learning curves.

    python -m benchmarks.real_learning --json real_learning.json --png real_learning.png     # default size
    python -m benchmarks.real_learning --quick                                               # smoke
    python -m benchmarks.real_learning --arms alone --seeds 2 --lr-full 3e-6 --lr-lora 3e-5 --json lr1.json
    python -m benchmarks.real_learning --merge lr*.json                    # the learning-rate sweep's table
    python -m benchmarks.real_learning --arms alone --json a.json &         # arms (or seeds) on two cores,
    python -m benchmarks.real_learning --arms ftis --json f.json; wait      # then one table of both:
    python -m benchmarks.real_learning --combine a.json f.json --json both.json --png both.png

The preset is built on first use (`swarm-node make-model --preset smollm2-135m`; needs the smollm2 extra).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import torch

from swarm_node.config import NodeConfig, load_config
from swarm_node.evaluation import score_prompts
from swarm_node.grpo.round import GRPONode
from swarm_node.runs.stats import fmt_ms, mean_std, paired_difference
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

PEERS_DIR = Path(__file__).resolve().parents[1] / "peers"
PEERS = ("smollm2-135m", "smollm2-135m-lora")
ARMS = ("alone", "ftis", "naive")


def peer_config(name: str, seed: int, args: argparse.Namespace, variant: str) -> NodeConfig:
    """The shipped peer config with the swarm off, this run's rounds and seed, and the arm's loss."""
    # rounds unset and no periodic eval: this benchmark scores the models itself (the same function the node uses)
    sets = [f"seed={seed}", "swarm.enabled=false", "rounds=null", "metrics.eval_every=1000000",
            f"training.variant={variant}", f"task.eval_n={args.eval_n}"]
    if args.prompts:
        sets.append(f"task.prompts_per_round={args.prompts}")
    lr = args.lr_lora if name.endswith("-lora") else args.lr_full
    if lr is not None:
        sets.append(f"training.lr={lr}")
    return load_config(PEERS_DIR / f"{name}.yaml", sets)


def scored(node: GRPONode, n: int) -> tuple[float, list[bool]]:
    """Greedy accuracy and per-problem hits on the first n held-out problems, as the node's own eval scores them."""
    c = node.cfg
    prompts = node.task.eval_prompts(c.task.eval_split, n)
    hits, _ = score_prompts(node.loaded.model, node.tok, node.task, prompts, c.generation.max_new_tokens,
                            batch_size=64, encode=node.prompts.encode)
    return (float(np.mean(hits)) if hits else 0.0), hits


def run_arm(arm: str, seed: int, args: argparse.Namespace, start: dict) -> list[dict]:
    """Both peers for args.rounds rounds under one arm; one result per peer."""
    variant = {"alone": "ftis", "ftis": "ftis", "naive": "naive"}[arm]  # alone: F-TIS on own samples = GRPO
    with TemporaryDirectory() as tmp:
        torch.manual_seed(seed)
        nodes = [GRPONode(peer_config(p, seed, args, variant), Path(tmp) / p) for p in PEERS]
        sample = [node.generate for node in nodes]
        fresh: dict[int, object] = {}
        for i, node in enumerate(nodes):
            node.generate = lambda round_, i=i: fresh[i]
            if arm != "alone":
                node.external_source = lambda round_, o=1 - i: fresh[o].train_groups(source=PEERS[o])
        curves = [[(0, start[p][0])] for p in PEERS]
        split = {p: {"sample": 0.0, "train": 0.0} for p in PEERS}
        rewards: list[list[float]] = [[], []]
        external = [0, 0]
        for r in range(1, args.rounds + 1):
            for i in range(2):  # both sample from their pre-update policies, then both train
                t0 = time.perf_counter()
                fresh[i] = sample[i](r)
                split[PEERS[i]]["sample"] += time.perf_counter() - t0
            for i, node in enumerate(nodes):
                row = node.run_round()
                split[PEERS[i]]["train"] += row["train_s"]
                rewards[i].append(row["reward_mean"])
                external[i] += row["external_groups"]
                if r % args.curve_every == 0 and r != args.rounds:
                    curves[i].append((r, scored(node, args.curve_n)[0]))
        out = []
        for i, node in enumerate(nodes):
            acc, hits = scored(node, args.eval_n)
            curves[i].append((args.rounds, acc))
            out.append({"arm": arm, "seed": seed, "model": PEERS[i], "start": start[PEERS[i]][0],
                        "start_hits": start[PEERS[i]][1], "end": acc, "hits": hits, "curve": curves[i],
                        "reward_first": float(np.mean(rewards[i][: max(1, args.rounds // 4)])),
                        "reward_last": float(np.mean(rewards[i][-max(1, args.rounds // 4):])),
                        "external_groups_trained": external[i],
                        "sample_s_per_round": split[PEERS[i]]["sample"] / args.rounds,
                        "train_s_per_round": split[PEERS[i]]["train"] / args.rounds})
            node.close()
        return out


def verdicts(results: list[dict]) -> list[dict]:
    """Per peer and arm: end accuracy over seeds; gain over the start (paired), over alone, over naive."""
    table = []
    for model in PEERS:
        by_arm = {a: {r["seed"]: r for r in results if r["model"] == model and r["arm"] == a} for a in ARMS}
        for arm in ARMS:
            rows = list(by_arm[arm].values())
            if not rows:
                continue
            learn = [({"acc": r["end"], "hits": r["hits"]}, {"acc": r["start"], "hits": r["start_hits"]}) for r in rows]
            entry = {"model": model, "arm": arm, "seeds": sorted(by_arm[arm]), "start": rows[0]["start"],
                     "end": mean_std([r["end"] for r in rows]), "gain": paired_difference(learn, "acc", "hits")}
            for base in ("alone", "naive"):
                pairs = [(r, by_arm[base][r["seed"]]) for r in rows if r["seed"] in by_arm[base]]
                if base != arm and pairs and not (arm == "alone" and base == "naive"):
                    entry[f"vs_{base}"] = paired_difference(pairs, "end", "hits")
            table.append(entry)
    return table


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PEERS), figsize=(4.4 * len(PEERS), 3.4), squeeze=False)
    for ax, model in zip(axes[0], PEERS, strict=True):
        for arm in ARMS:
            rows = [r for r in results if r["model"] == model and r["arm"] == arm]
            if not rows:
                continue
            xs = [x for x, _ in rows[0]["curve"]]
            ys = np.array([[y for _, y in r["curve"]] for r in rows])
            m = ys.mean(axis=0)
            s = ys.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(len(xs))
            ax.plot(xs, m, marker="o", label=arm, linestyle="--" if arm == "alone" else "-")
            ax.fill_between(xs, m - s, m + s, alpha=0.15)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("held-out accuracy")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def default_lr(model: str) -> float:
    """The rate a peer config trains at: its training.lr, else the preset's default (models/presets.py)."""
    from swarm_node.models.presets import PACKAGED

    lr = load_config(PEERS_DIR / f"{model}.yaml").training.lr
    spec = PACKAGED["smollm2-135m"]
    return float(lr if lr is not None else spec.lr_lora if model.endswith("-lora") else spec.lr_full)


def sweep_table(paths: list[Path]) -> None:
    """Rows of alone runs at several learning rates -> gain over the start per (peer, rate), paired per problem,
    and each rate against the peer's configured default (paired across the same seeds)."""
    by: dict[tuple[str, float], list[dict]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        a = data["args"]
        for r in data["results"]:
            if r["arm"] != "alone":
                continue
            lr = a["lr_lora"] if r["model"].endswith("-lora") else a["lr_full"]
            by.setdefault((r["model"], float(lr if lr is not None else default_lr(r["model"]))), []).append(r)
    print(f"{'peer':18s} {'lr':>8s} {'seeds':>8s} {'end (mean +- std)':>18s} {'gain over start':>28s} "
          f"{'vs the default rate':>28s}")
    for (model, lr), rows in sorted(by.items()):
        default = default_lr(model)
        base = {r["seed"]: r for r in by.get((model, default), [])}
        learn = [({"acc": r["end"], "hits": r["hits"]}, {"acc": r["start"], "hits": r["start_hits"]}) for r in rows]
        pairs = [(r, base[r["seed"]]) for r in rows if r["seed"] in base]
        vs = fmt(paired_difference(pairs, "end", "hits")) if pairs and lr != default else "-"
        print(f"{model:18s} {lr:8.0e} {','.join(str(r['seed']) for r in rows):>8s} "
              f"{fmt_ms(mean_std([r['end'] for r in rows])):>18s} {fmt(paired_difference(learn, 'acc', 'hits')):>28s} "
              f"{vs:>28s}")


def fmt(d: tuple[float, float, str]) -> str:
    return f"{d[0]:+.3f} +- {d[1]:.3f} {d[2]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=3, quick_seeds=1, quick="1 seed, 3 rounds, n=40 (curves every 2 rounds on 20), arms alone and ftis")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=None, help="prompts per round (default: the peer configs')")
    ap.add_argument("--eval-n", type=int, default=200, help="held-out problems scored at the start and the end (the 0..20 split has 88)")
    ap.add_argument("--curve-every", type=int, default=8)
    ap.add_argument("--curve-n", type=int, default=200)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--lr-full", type=float, default=None, help="learning rate of the full peer (default: its config's)")
    ap.add_argument("--lr-lora", type=float, default=None, help="learning rate of the LoRA peer (default: its config's)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="learning-rate sweep: print gain over the start per peer and rate from earlier --json files "
                         "(each an --arms alone run with its --lr-full/--lr-lora)")
    ap.add_argument("--combine", type=Path, nargs="+", default=None,
                    help="one table (and --json/--png) from earlier --json files of the same size, each with other arms "
                         "or seeds: how to use both cores, one process per part")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared machine)")
    ap.add_argument("--png", type=Path, default=None, help="also plot the learning curves here")
    args = ap.parse_args()
    if args.merge:
        return sweep_table(args.merge)
    if args.combine:
        return combine(args.combine, args)
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds, args.eval_n, args.curve_every, args.curve_n, args.arms = 3, 40, 2, 20, ["alone", "ftis"]
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with TemporaryDirectory() as tmp:  # the start model is the same for every seed and arm: score it once
        starter = GRPONode(peer_config(PEERS[0], seeds[0], args, "ftis"), Path(tmp))
        acc, hits = scored(starter, args.eval_n)
        start = {p: (acc, hits) for p in PEERS}  # a fresh LoRA adapter (B = 0) is the base model exactly
        starter.close()
        del starter
    print(f"start: held-out accuracy {acc:.3f} (n={args.eval_n}) [{time.perf_counter() - t0:.0f} s]", flush=True)
    results: list[dict] = []
    for seed in seeds:
        for arm in args.arms:
            out = run_arm(arm, seed, args, start)
            results.extend(out)
            print(f"[{time.perf_counter() - t0:6.0f}s] seed {seed} {arm:5s} " + "  ".join(
                f"{o['model']}: {o['start']:.3f}->{o['end']:.3f} (reward {o['reward_first']:.2f}->{o['reward_last']:.2f}, "
                f"{o['external_groups_trained']} partner groups, "
                f"{o['sample_s_per_round']:.1f}+{o['train_s_per_round']:.1f} s/round)" for o in out), flush=True)
    report(results, args, time.perf_counter() - t0)


def report(results: list[dict], args: argparse.Namespace, total: float) -> None:
    """The table of verdicts and the time per round; --json and --png where asked."""
    table = verdicts(results)
    seeds = sorted({r["seed"] for r in results})
    cfg = peer_config(PEERS[0], seeds[0], args, "ftis")
    print(f"\n{args.rounds} rounds, {cfg.task.prompts_per_round} prompts x {cfg.generation.num_generations} per peer per "
          f"round, {cfg.generation.max_new_tokens} new tokens, held-out n={args.eval_n}, seeds {seeds}; "
          "gains are paired per problem (+- SE, 2-SE verdict)\n")
    print(f"{'peer':18s} {'arm':6s} {'start':>6s} {'end (mean +- std)':>18s} {'gain over start':>28s} "
          f"{'vs alone':>28s} {'vs naive':>28s}")
    for e in table:
        print(f"{e['model']:18s} {e['arm']:6s} {e['start']:6.3f} {fmt_ms(e['end']):>18s} {fmt(e['gain']):>28s} "
              f"{fmt(e['vs_alone']) if 'vs_alone' in e else '-':>28s} {fmt(e['vs_naive']) if 'vs_naive' in e else '-':>28s}")
    per_round = {m: mean_std([r["sample_s_per_round"] + r["train_s_per_round"] for r in results if r["model"] == m])
                 for m in PEERS}
    print("\nseconds per round (sample + train, mean +- std over runs): " +
          ", ".join(f"{m} {fmt_ms(v, '.1f')}" for m, v in per_round.items()))
    print(f"total {total:.0f} s")
    write_json(args.json, {"args": public_args(args, drop=("merge", "combine")), "seconds": round(total, 1),
                           "results": results, "table": table}, args)
    if args.png:
        plot(results, args.png)


def combine(paths: list[Path], args: argparse.Namespace) -> None:
    """Runs of other arms or seeds at one size -> one report; their seconds add up (wall time if run one by one)."""
    parts = [json.loads(p.read_text()) for p in paths]
    size = {k: parts[0]["args"][k] for k in ("rounds", "eval_n", "prompts", "lr_full", "lr_lora")}
    for path, part in zip(paths, parts, strict=True):
        other = {k: part["args"][k] for k in size}
        if other != size:
            raise SystemExit(f"{path}: run at {other}, not {size} like {paths[0]}: cannot combine")
    seen: set[tuple] = set()
    results = []
    for path, part in zip(paths, parts, strict=True):
        for r in part["results"]:
            key = (r["arm"], r["seed"], r["model"])
            if key in seen:
                raise SystemExit(f"{path}: {key} is also in an earlier file: cannot combine")
            seen.add(key)
            results.append(r)
    for k, v in size.items():
        setattr(args, k, v)
    print(f"combined {len(results)} runs from {len(paths)} files: " +
          ", ".join(f"{p} ({part['seconds']:.0f} s)" for p, part in zip(paths, parts, strict=True)))
    report(results, args, sum(part["seconds"] for part in parts))


if __name__ == "__main__":
    main()
