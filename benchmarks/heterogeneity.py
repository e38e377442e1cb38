"""The F-TIS paper's Table 2 at tiny scale: pairs of different models sharing samples, per variant, over seeds.

Each pair trains two models side by side in one process. Every round each model samples G completions
for its own prompts and trains on them plus the other model's fresh samples of that round (exactly what a
2-peer swarm exchanges, without the network), with one loss variant for both. The "alone" arm trains each
model on its own samples only. All arms of a seed see the same prompts and are scored on the same
held-out problems, so differences against "alone" are paired.

Pairs (--pairs):
  size       tiny-s + tiny-m (Llama vs Qwen2, different sizes)
  trainable  tiny-s full parameters + tiny-s through a LoRA adapter
  expertise  tiny-s + tiny-s warmed up with another seed (same size and data, different skills); a preset
             warmed on another task mix belongs here once the factory offers one
Arms (--arms): alone, naive, vis, tis, filter, ftis (training.variant; docs/algorithms.md).

Reported per pair, model and arm: in- and out-of-distribution accuracy at the end (mean +- std over seeds),
the gain over "alone" (does sharing help at all) and over "naive" (does the correction beat plain sharing),
each with its paired standard error and a verdict (higher / lower / cannot tell at 2 SE), and the filtered
share of the partner's sequences. The JSON keeps every run's per-problem hits for further pairings. Learning curves with +-1 std bands go to a PNG.

    python -m benchmarks.heterogeneity --seeds 5 --json heterogeneity.json --png heterogeneity.png
    python -m benchmarks.heterogeneity --quick --json heterogeneity-quick.json      # 2 seeds
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from swarm_node.grpo.round import GRPONode
from swarm_node.runs.stats import fmt_ms, mean_std, paired_difference
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.benchmark_nodes import grpo_node, heldout_score, node_config, one_thread, run_jobs

PAIRS: dict[str, tuple[dict, dict]] = {
    "size": ({"path": "tiny-s"}, {"path": "tiny-m"}),
    "trainable": ({"path": "tiny-s"}, {"path": "tiny-s", "name": "tiny-s-lora",
                                       "lora": {"enabled": True, "r": 8, "alpha": 16}}),
    "expertise": ({"path": "tiny-s"}, {"path": "tiny-s", "name": "tiny-s-seed1", "preset_seed": 1}),
}
ARMS = ("alone", "naive", "vis", "tis", "filter", "ftis")


def model_name(m: dict) -> str:
    return m.get("name") or m["path"]


def preset_path(m: dict, cache: dict) -> str:
    """A preset built with another warm-up seed, for the expertise pair; other models by their name."""
    seed = m.get("preset_seed")
    if seed is None:
        return m["path"]
    if (m["path"], seed) not in cache:
        from swarm_node.models.factory import ensure_preset

        cache[(m["path"], seed)] = str(ensure_preset(m["path"], Path(tempfile.gettempdir()) / f"het-presets-{seed}",
                                                     seed=seed))
    return cache[(m["path"], seed)]


def node_for(m: dict, variant: str, seed: int, args: argparse.Namespace, workdir: Path, cache: dict) -> GRPONode:
    model = {k: v for k, v in m.items() if k != "preset_seed"} | {"path": preset_path(m, cache)}
    model.setdefault("name", model_name(m))
    cfg = node_config(model, seed, prompts=args.prompts, eval_n=args.eval_n, training={"variant": variant})
    return grpo_node(cfg, workdir)


def run_arm(pair: str, arm: str, seed: int, args: argparse.Namespace, cache: dict) -> list[dict]:
    """Train the pair's two models for args.rounds rounds under one arm; one result dict per model."""
    with tempfile.TemporaryDirectory() as tmp:
        variant = "on_policy" if arm == "alone" else arm
        nodes = [node_for(m, variant, seed, args, Path(tmp) / str(i), cache) for i, m in enumerate(PAIRS[pair])]
        sample = [node.generate for node in nodes]  # each model's own sampler, before the overrides below
        fresh: dict[int, object] = {}
        for i, node in enumerate(nodes):
            node.generate = lambda round_, i=i: fresh[i]  # run_round trains on this round's samples
            if arm != "alone":
                node.external_source = (lambda round_, o=1 - i: fresh[o].train_groups(
                    source=model_name(PAIRS[pair][o])))
        start = [heldout_score(n, s, args.eval_n) for n in nodes for s in ("id", "ood")]
        curves: list[list[tuple[int, float]]] = [[(0, start[0].accuracy)], [(0, start[2].accuracy)]]
        filtered = [0, 0]
        external = [0, 0]
        for r in range(1, args.rounds + 1):
            fresh.update({i: sample[i](r) for i in range(2)})  # both sample from their pre-update policies
            for i, node in enumerate(nodes):
                row = node.run_round()
                filtered[i] += row["filtered_external"]
                external[i] += sum(row["external_groups_by_peer"].values()) * 8
                if r % args.curve_every == 0 and r != args.rounds:
                    curves[i].append((r, heldout_score(node, "id", args.curve_n).accuracy))
        out = []
        for i, node in enumerate(nodes):
            acc_id, hits_id = heldout_score(node, "id", args.eval_n)
            acc_ood, hits_ood = heldout_score(node, "ood", args.eval_n)
            curves[i].append((args.rounds, acc_id))
            finite = all(torch.isfinite(p).all() for p in node.loaded.model.parameters())
            out.append({"pair": pair, "arm": arm, "seed": seed, "model": model_name(PAIRS[pair][i]),
                        "start_id": start[2 * i].accuracy, "start_ood": start[2 * i + 1].accuracy, "end_id": acc_id,
                        "end_ood": acc_ood, "hits_id": hits_id, "hits_ood": hits_ood, "curve": curves[i],
                        "filtered_share": filtered[i] / external[i] if external[i] else None,
                        "params_finite": bool(finite)})
        return out


def _run_job(job: tuple[str, str, int, argparse.Namespace, dict]) -> list[dict]:
    pair, arm, seed, args, cache = job
    return run_arm(pair, arm, seed, args, cache)


def paired_gain(rows: list[dict], base: dict[int, dict], split: str) -> tuple[float, float, str]:
    """Mean over seeds of (arm - base) on one split, its SE (per-problem pairs within a seed, spread across
    seeds) and the 2-SE verdict; nan and "cannot tell" when no seed has both."""
    paired = [(r, base[r["seed"]]) for r in rows if r["seed"] in base]
    if not paired:
        return float("nan"), float("nan"), "cannot tell"
    return paired_difference(paired, f"end_{split}", f"hits_{split}")


def summarise(results: list[dict]) -> list[dict]:
    """Per (pair, model, arm): end accuracies over seeds, and the paired gains over the same seeds' alone arm
    (does sharing help at all) and naive arm (does the correction beat plain sharing)."""
    table = []
    keys = sorted({(r["pair"], r["model"], r["arm"]) for r in results}, key=lambda k: (k[0], k[1], ARMS.index(k[2])))
    for pair, model, arm in keys:
        rows = [r for r in results if (r["pair"], r["model"], r["arm"]) == (pair, model, arm)]
        entry = {"pair": pair, "model": model, "arm": arm, "seeds": sorted(r["seed"] for r in rows),
                 "end_id": mean_std([r["end_id"] for r in rows]), "end_ood": mean_std([r["end_ood"] for r in rows]),
                 "start_id": mean_std([r["start_id"] for r in rows]),
                 "start_ood": mean_std([r["start_ood"] for r in rows]),
                 "filtered_share": mean_std([r["filtered_share"] for r in rows])}
        for baseline in ("alone", "naive"):
            base = {r["seed"]: r for r in results if (r["pair"], r["model"], r["arm"]) == (pair, model, baseline)}
            skip = ARMS.index(arm) <= ARMS.index(baseline)  # alone vs itself; naive and alone vs naive
            for split in ("id", "ood"):
                d, se, v = (float("nan"), float("nan"), "-") if skip else paired_gain(rows, base, split)
                entry[f"gain_vs_{baseline}_{split}"] = d
                entry[f"se_vs_{baseline}_{split}"] = se
                entry[f"verdict_{split}" if baseline == "alone" else f"verdict_vs_naive_{split}"] = v
        table.append(entry)
    return table


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["pair"], r["model"]) for r in results})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (pair, model) in zip(axes[0], panels, strict=True):
        for arm in ARMS:
            rows = [r for r in results if (r["pair"], r["model"], r["arm"]) == (pair, model, arm)]
            if not rows:
                continue
            xs = [x for x, _ in rows[0]["curve"]]
            ys = np.array([[y for _, y in r["curve"]] for r in rows])
            m, s = ys.mean(axis=0), ys.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(len(xs))
            ax.plot(xs, m, label=arm, linestyle="--" if arm == "alone" else "-")
            ax.fill_between(xs, m - s, m + s, alpha=0.15)
        ax.set_title(f"{pair}: {model}", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("held-out accuracy (id)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=5, quick_seeds=2, quick="10 rounds, n=200 held-out problems, curves every 5 on 100")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--eval-n", type=int, default=400)
    ap.add_argument("--curve-every", type=int, default=10)
    ap.add_argument("--curve-n", type=int, default=200)
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                    help="runs in parallel, one process and one thread each (default: 2 or the core count)")
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds, args.eval_n, args.curve_every, args.curve_n = 10, 200, 5, 100
    if "alone" not in args.arms:
        args.arms = ["alone", *args.arms]
    one_thread()
    t0, results, cache = time.perf_counter(), [], {}
    for pair in args.pairs:  # build the expertise pair's other-seed preset once, before any worker needs it
        for m in PAIRS[pair]:
            preset_path(m, cache)
    jobs = [(pair, arm, seed, args, cache) for pair in args.pairs for seed in seeds for arm in args.arms]
    print(f"{len(jobs)} runs ({len(args.pairs)} pairs x {len(seeds)} seeds x {len(args.arms)} arms), "
          f"{args.workers} at a time", flush=True)

    def report(out: list[dict]) -> None:
        results.extend(out)
        o0 = out[0]
        print(f"[{time.perf_counter() - t0:6.0f}s] {o0['pair']:9s} seed {o0['seed']} {o0['arm']:6s} " + "  ".join(
            f"{o['model']}: id {o['start_id']:.3f}->{o['end_id']:.3f} ood {o['start_ood']:.3f}->"
            f"{o['end_ood']:.3f}" for o in out), flush=True)

    run_jobs(_run_job, jobs, args.workers, report)  # in job order: the printout and JSON are deterministic
    table = summarise(results)
    print(f"\n{args.rounds} rounds, {args.prompts} prompts x 8 per model per round, held-out n={args.eval_n} "
          f"(id and ood), seeds {seeds}; mean +- std over seeds; gain = paired difference vs alone (+- SE)\n")
    print(f"{'pair':9s} {'model':13s} {'arm':6s} {'id end':>15s} {'ood end':>15s} {'id vs alone':>15s} {'':12s} "
          f"{'ood vs alone':>15s} {'':12s} {'id vs naive':>15s} {'':12s} {'ood vs naive':>15s} {'':12s} "
          f"{'filtered':>8s}")

    def gain(e: dict, baseline: str, split: str) -> str:
        d, se = e[f"gain_vs_{baseline}_{split}"], e[f"se_vs_{baseline}_{split}"]
        v = e[f"verdict_{split}" if baseline == "alone" else f"verdict_vs_naive_{split}"]
        return f"{'-':>15s} {'':12s}" if np.isnan(d) else f"{f'{d:+.3f} +- {se:.3f}':>15s} {v:12s}"

    for e in table:
        fs = e["filtered_share"][0]
        print(f"{e['pair']:9s} {e['model']:13s} {e['arm']:6s} {fmt_ms(e['end_id']):>15s} {fmt_ms(e['end_ood']):>15s} "
              + " ".join(gain(e, b, sp) for b in ("alone", "naive") for sp in ("id", "ood"))
              + f" {'-' if np.isnan(fs) else f'{fs:.3f}':>8s}")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.png:
        plot(results, args.png)
        print(f"curves: {args.png}")
    # per-problem hits as "0101..." strings, so any two arms of a seed can be paired again from the file
    slim = [{k: ("".join("1" if h else "0" for h in v) if k.startswith("hits_") else v) for k, v in r.items()}
            for r in results]
    write_json(args.json, {"args": public_args(args), "seeds": seeds, "table": table, "runs": slim}, args)


if __name__ == "__main__":
    main()
