"""Learning-rate sweep per preset: held-out accuracy of a node training alone, over several seeds.

For each arm (tiny-s full, tiny-s LoRA, tiny-m full) and learning rate, runs the real GRPO round loop
(`GRPONode`, on-policy, alone) for --rounds rounds from the preset and measures greedy accuracy on the
held-out `id` split and on `ood` (docs/tasks.md) before and after. Seeds are paired across learning rates
(the same prompts and sampling seeds), so each rate is compared with the preset's current default
(`models.presets`) by the per-seed difference of end accuracies, with a standard error that takes the
larger of the seed-to-seed spread and the per-problem paired SE (`runs.stats.combined_se`); a rate is
called better or worse only beyond two SEs, else "cannot tell".

One (arm, rate) per process keeps each job short enough for a shared machine; --merge prints the table:

    python -m benchmarks.lr_sweep --arms tiny-s --lrs 1e-5 --seeds 3 --json out/tiny-s-1e-5.json
    python -m benchmarks.lr_sweep --merge out/*.json
    python -m benchmarks.lr_sweep --quick          # 2 rates per arm, 20 rounds, n=200: a smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from swarm_node.models.presets import PRESETS
from swarm_node.runs.stats import fmt_ms, mean_std, paired_difference
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json
from tooling.benchmark_nodes import grpo_node, heldout_score, node_config

GRID = {
    "tiny-s": [1e-5, 3e-5, 1e-4],
    "tiny-s-lora": [1e-4, 3e-4, 1e-3],
    "tiny-m": [1e-5, 3e-5, 1e-4],
}
QUICK_GRID = {"tiny-s": [3e-5, 1e-4], "tiny-s-lora": [3e-4, 1e-3], "tiny-m": [3e-5, 1e-4]}
SPLITS = ("id", "ood")
SCORE_NEW_TOKENS = 8  # the node samples 6; the sweep's committed tables scored 8, like `swarm-node eval`


def default_of(arm: str) -> float:
    preset = PRESETS["tiny-m" if arm == "tiny-m" else "tiny-s"]
    return preset.lr_lora if arm.endswith("lora") else preset.lr_full


def run_one(arm: str, lr: float, seed: int, rounds: int, prompts: int, eval_n: int, state_dir: Path,
            start: dict | None = None) -> dict:
    """One run; `start` caches the scores of the preset as loaded (greedy, so the same for every rate and seed)."""
    model = {"path": "tiny-m" if arm == "tiny-m" else "tiny-s", "lora": {"enabled": arm.endswith("lora")}}
    cfg = node_config(model, seed, prompts=prompts, eval_n=eval_n, training={"variant": "on_policy", "lr": lr})
    node = grpo_node(cfg, state_dir)

    def scored() -> dict:
        out = {}
        for split in SPLITS:  # scored with 8 new tokens (as `swarm-node eval`), as the committed tables were
            score = heldout_score(node, split, eval_n, max_new_tokens=SCORE_NEW_TOKENS)
            out[split] = {"accuracy": sum(score.hits) / len(score.hits), "hits": score.hits}
        return out

    if start is None or arm not in start:
        before = scored()
        if start is not None:
            start[arm] = before
    before = start[arm] if start is not None else before
    t0 = time.perf_counter()
    for _ in range(rounds):
        node.run_round()
    seconds = round(time.perf_counter() - t0, 1)
    after = scored()
    return {"arm": arm, "lr": lr, "seed": seed, "rounds": rounds, "prompts": prompts, "eval_n": eval_n,
            "model_sha256": node.loaded.meta.get("sha256"), "seconds": seconds,
            **{f"before_{s}": before[s]["accuracy"] for s in SPLITS},
            **{f"after_{s}": after[s]["accuracy"] for s in SPLITS},
            **{f"hits_{s}": after[s]["hits"] for s in SPLITS}}


def summarize(rows: list[dict]) -> dict:
    """Per arm and rate: end accuracy and gain (mean, std over seeds), and the paired difference from the
    preset's default rate (mean over seeds, combined SE, verdict)."""
    out: dict = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        base_lr = default_of(arm)
        by_key = {(r["lr"], r["seed"]): r for r in mine}
        per_lr: dict = {}
        for lr in sorted({r["lr"] for r in mine}):
            runs = [r for r in mine if r["lr"] == lr]
            v: dict = {"seeds": sorted(r["seed"] for r in runs)}
            for s in SPLITS:
                v[f"end_{s}"] = mean_std([r[f"after_{s}"] for r in runs])
                v[f"gain_{s}"] = mean_std([r[f"after_{s}"] - r[f"before_{s}"] for r in runs])
                pairs = [(r, by_key[(base_lr, r["seed"])]) for r in runs if (base_lr, r["seed"]) in by_key]
                if lr != base_lr and pairs:
                    d, se, vd = paired_difference(pairs, f"after_{s}", f"hits_{s}")
                    v[f"vs_default_{s}"] = {"diff": d, "se": se, "n": len(pairs), "verdict": vd}
            per_lr[lr] = v
        better = [lr for lr, v in per_lr.items() if v.get("vs_default_id", {}).get("verdict") == "higher"]
        pick = max(better, key=lambda lr: per_lr[lr]["vs_default_id"]["diff"]) if better else base_lr
        out[arm] = {"default_lr": base_lr, "by_lr": per_lr, "pick": pick,
                    "decided": bool(better) or all(v.get("vs_default_id", {}).get("verdict") == "lower"
                                                   for lr, v in per_lr.items() if lr != base_lr)}
    return out


def fmt_gain(ms: tuple[float, float]) -> str:
    return f"{ms[0]:+.3f} +- {ms[1]:.3f}"


def print_table(rows: list[dict]) -> None:
    summary = summarize(rows)
    r0 = rows[0]
    seeds = sorted({r["seed"] for r in rows})
    print(f"\n{r0['rounds']} rounds x {r0['prompts']} prompts x 8 samples, alone, on-policy; held-out id and ood, "
          f"n={r0['eval_n']}; seeds {seeds}; mean +- std over seeds; vs default = paired difference of end "
          "accuracy (combined SE)")
    print("| preset | learning rate | start id | end id | gain id | end ood | gain ood | id vs default | ood vs default |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, s in summary.items():
        for lr, v in s["by_lr"].items():
            start = mean_std([r["before_id"] for r in rows if r["arm"] == arm and r["lr"] == lr])[0]
            mark = " (default)" if lr == s["default_lr"] else ""

            def vs(split: str, v: dict = v) -> str:
                c = v.get(f"vs_default_{split}")
                return "-" if c is None else f"{c['diff']:+.3f} ({c['se']:.3f}) {c['verdict']}"

            print(f"| {arm} | {lr:g}{mark} | {start:.3f} | {fmt_ms(v['end_id'])} | {fmt_gain(v['gain_id'])} | "
                  f"{fmt_ms(v['end_ood'])} | {fmt_gain(v['gain_ood'])} | {vs('id')} | {vs('ood')} |")
    for arm, s in summary.items():
        word = f"{s['pick']:g}" + ("" if s["decided"] else " (kept: cannot tell)")
        print(f"{arm}: default {s['default_lr']:g} -> {word}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, seeds=3, first_seed=1, quick="two learning rates per arm, 20 rounds, eval on 200")
    ap.add_argument("--arms", default="tiny-s,tiny-s-lora,tiny-m")
    ap.add_argument("--lrs", default=None, help="comma-separated rates for every arm given (default: the grid)")
    ap.add_argument("--rounds", type=int, default=None, help="default: 40 (20 with --quick)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per round (the demo's 16)")
    ap.add_argument("--eval-n", type=int, default=None, help="default: 400 (200 with --quick)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help="print the table of earlier --json files")
    args = ap.parse_args()
    if args.merge:
        print_table([r for f in args.merge for r in json.loads(f.read_text())["rows"]])
        return
    seeds = resolve_seeds(args)
    torch.set_num_threads(1)
    rounds = args.rounds or (20 if args.quick else 40)
    eval_n = args.eval_n or (200 if args.quick else 400)
    grid = QUICK_GRID if args.quick else GRID
    rows: list[dict] = []
    start: dict = {}
    for arm in args.arms.split(","):
        for lr in [float(x) for x in args.lrs.split(",")] if args.lrs else grid[arm]:
            for seed in seeds:
                with tempfile.TemporaryDirectory() as tmp:
                    r = run_one(arm, lr, seed, rounds, args.prompts, eval_n, Path(tmp), start)
                rows.append(r)
                print(f"{arm} lr={lr:g} seed={seed}: id {r['before_id']:.3f} -> {r['after_id']:.3f}, ood "
                      f"{r['before_ood']:.3f} -> {r['after_ood']:.3f} ({r['seconds']} s)", flush=True)
                write_json(args.json, {"rows": rows}, args)  # after every run: a killed job keeps what it measured
    print_table(rows)


if __name__ == "__main__":
    main()
