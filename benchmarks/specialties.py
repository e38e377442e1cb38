"""Where the swarm pays: one task universe, peers of different models that each sample only their own part.

The arithmetic universe has three parts (docs/tasks.md): `add` ("12+7="), `sub` ("12-7=") and `signed`
("+12-7=", the leading-sign format no preset was warmed up on). A node's mix (`task.mix`) says which parts it
samples; peers of one universe with other mixes share a swarm. Every run trains the real round loop
(`GRPONode.run_round`) in one process, peers exchanging each round's fresh samples as a swarm would (the
setting of benchmarks/heterogeneity.py), and scores every model on the same held-out problems of every part
(the `union` split: add, sub and signed in turns), so every comparison is paired per problem and seed
(swarm_node/runs/stats.py).

Experiments (--experiment):
  specialties  (default) tiny-s samples only add, tiny-m only sub, tiny-s-lora only signed. Arms:
               alone:PART   each model alone on one part (alone on its own part, and the transfer matrix:
                            what training on one part does to the others)
               alone:full   each model alone on the full mix (all three parts), the same 16 prompts a round:
                            the reference
               naive, ftis  (and tis, vis with --arms) the three together, each sampling only its own part and
                            training on its own and the other two's samples of the round
  strong       a weak model (tiny-s warmed up with seed 1) beside a stronger one (tiny-m-long), both on the
               full mix: alone:full, naive, ftis, tis
  compute      the SAPO setting: tiny-s and tiny-m draw the same prompts; local8 trains on 8 own completions
               per prompt, local4 on 4, shared4+4 (naive, ftis) on groups of its own 4 and the partner's 4
               completions of the same prompt (half the generation of local8, the same training)

The claims checked (specialties): (a) every peer's union accuracy under F-TIS is above its alone-on-own-part
arm beyond 2 paired SE; (b) on each part a peer never samples it gains at least half of what training alone
on that part gives it; (c) it ends within 1 point of (or above) the alone-on-full-mix reference.

    python -m benchmarks.specialties --seeds 5 --json specialties.json --png specialties.png
    python -m benchmarks.specialties --experiment strong --seeds 3 --json strong.json
    python -m benchmarks.specialties --experiment compute --seeds 3 --json compute.json
    python -m benchmarks.specialties --quick --seeds 1                       # smoke size
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Loading weights" bar per run (workers inherit it)
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from swarm_node.config import NodeConfig
from swarm_node.evaluation import evaluate
from swarm_node.grpo.rollouts import LocalRollouts
from swarm_node.grpo.round import GRPONode
from swarm_node.runs.stats import fmt_ms, linear_contrast, mean_std, paired_difference
from swarm_node.tasks.arithmetic import PARTS
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.benchmark_nodes import one_thread, run_jobs

MODELS: dict[str, dict] = {
    "tiny-s": {"path": "tiny-s"},
    "tiny-m": {"path": "tiny-m"},
    "tiny-s-lora": {"path": "tiny-s", "name": "tiny-s-lora", "lora": {"enabled": True, "r": 8, "alpha": 16}},
    "tiny-s-seed1": {"path": "tiny-s", "name": "tiny-s-seed1", "preset_seed": 1},
    "tiny-m-long": {"path": "tiny-m", "name": "tiny-m-long", "preset_steps": 1500},  # the whole cosine horizon
}
FULL = "full"
EXPERIMENTS: dict[str, dict] = {
    "specialties": {"peers": [("tiny-s", "add"), ("tiny-m", "sub"), ("tiny-s-lora", "signed")],
                    "arms": [*(f"alone:{p}" for p in PARTS), "alone:full", "naive", "ftis"]},
    "strong": {"peers": [("tiny-s-seed1", FULL), ("tiny-m-long", FULL)], "arms": ["alone:full", "naive", "ftis", "tis"]},
    "compute": {"peers": [("tiny-s", FULL), ("tiny-m", FULL)], "arms": ["local8", "local4", "shared-naive", "shared-ftis"]},
}
SWARM_VARIANTS = ("naive", "ftis", "tis", "vis")


def mix_of(part: str) -> dict[str, float]:
    return {p: 1.0 for p in PARTS} if part == FULL else {part: 1.0}


def model_path(name: str) -> str:
    """A preset path; one built with another warm-up seed (tiny-s-seed1) or length (tiny-m-long) is built once
    into a temp dir (the seed-1 one is heterogeneity.py's)."""
    m = MODELS[name]
    seed, steps = m.get("preset_seed"), m.get("preset_steps")
    if seed is None and steps is None:
        return m["path"]
    from swarm_node.models.factory import ensure_preset

    where = f"het-presets-{seed}" if steps is None else f"spec-presets-{seed or 0}-steps{steps}"
    return str(ensure_preset(m["path"], Path(tempfile.gettempdir()) / where, seed=seed or 0, warmup_steps=steps))


def make_node(name: str, mix: dict, variant: str, seed: int, task_seed: int, g: int, args: argparse.Namespace,
              workdir: Path) -> GRPONode:
    model = {k: v for k, v in MODELS[name].items() if not k.startswith("preset_")} | {"path": model_path(name)}
    model.setdefault("name", name)
    cfg = NodeConfig.model_validate({
        "seed": seed, "model": model,
        "task": {"name": "arithmetic", "mix": mix, "seed": task_seed, "prompts_per_round": args.prompts,
                 "eval_split": "union", "eval_n": args.eval_n},
        "generation": {"num_generations": g, "max_new_tokens": 6},
        "training": {"variant": variant, **({"lr": args.lr_scale * default_lr(name)} if args.lr_scale != 1 else {})},
        "metrics": {"eval_every": 10**6}, "checkpoint": {"every_rounds": 10**6},
    })
    torch.manual_seed(seed)
    return GRPONode(cfg, workdir)


def default_lr(name: str) -> float:
    from swarm_node.models.presets import PRESETS

    preset = PRESETS[MODELS[name]["path"]]
    return preset.lr_lora if MODELS[name].get("lora") else preset.lr_full


def score(node: GRPONode, n: int) -> dict:
    """Union accuracy, each part's, and the per-problem hits of the first n `union` problems."""
    ev = evaluate(node.loaded.model, node.tok, node.task, "union", n, max_new_tokens=6, batch_size=64,
                  encode=node.prompts.encode)  # as the node encodes prompts (the same text for the presets)
    return {"union": ev["accuracy"], **{p: d["accuracy"] for p, d in ev["by_part"].items()}, "hits": ev["hits"]}


def curve_point(node: GRPONode, args: argparse.Namespace) -> dict:
    """Union and per-part accuracy on the first curve_n `union` problems."""
    return {k: v for k, v in score(node, args.curve_n).items() if k != "hits"}


def train(exp: str, arm: str, peers: list[tuple[str, str, int]], seed: int, args: argparse.Namespace) -> list[dict]:
    """Train `peers` ((model, part, task seed)) for args.rounds rounds under one arm; one result per peer.

    alone:* arms train one peer on its own samples; swarm arms train every peer on its own and the others'
    fresh samples of the round; compute arms merge each prompt's own and partner's completions into one group.
    """
    t0 = time.perf_counter()
    variant = "on_policy" if arm.startswith(("alone", "local")) else arm.removeprefix("shared-")
    g = 4 if arm.startswith("shared") or arm == "local4" else 8
    with tempfile.TemporaryDirectory() as tmp:
        nodes = [make_node(m, mix_of(part), variant, seed, ts, g, args, Path(tmp) / str(i))
                 for i, (m, part, ts) in enumerate(peers)]
        sample = [n.generate for n in nodes]  # each model's own sampler, before the overrides below
        fresh: dict[int, LocalRollouts] = {}
        for i, n in enumerate(nodes):
            if arm.startswith("shared"):
                n.generate = lambda r, i=i: merged(fresh[i], fresh[1 - i])
            else:
                n.generate = lambda r, i=i: fresh[i]
            if arm in SWARM_VARIANTS:
                n.external_source = (lambda r, i=i: [grp for j in range(len(nodes)) if j != i
                                                     for grp in fresh[j].train_groups(source=peers[j][0])])
        start = [score(n, args.eval_n) for n in nodes]
        # every curve point on the same first curve_n problems (the ends too), so a curve has no jump from a
        # change of problem set; the tables use start and end on all eval_n
        curves = [[(0, curve_point(n, args))] for n in nodes]
        filtered, external = [0] * len(nodes), [0] * len(nodes)
        for r in range(1, args.rounds + 1):
            fresh.update({i: sample[i](r) for i in range(len(nodes))})  # all sample from pre-update policies
            for i, n in enumerate(nodes):
                row = n.run_round()
                filtered[i] += row["filtered_external"]
                external[i] += sum(row["external_groups_by_peer"].values()) * g
                if r % args.curve_every == 0 or r == args.rounds:
                    curves[i].append((r, curve_point(n, args)))
        out = []
        for i, n in enumerate(nodes):
            end = score(n, args.eval_n)
            out.append({"experiment": exp, "arm": arm, "seed": seed, "model": peers[i][0], "part": peers[i][1],
                        "start": {k: v for k, v in start[i].items() if k != "hits"}, "hits_start": start[i]["hits"],
                        "end": {k: v for k, v in end.items() if k != "hits"}, "hits_end": end["hits"],
                        "curve": curves[i], "filtered_share": filtered[i] / external[i] if external[i] else None,
                        "seconds": round(time.perf_counter() - t0, 1)})
    return out


def merged(own: LocalRollouts, partner: LocalRollouts) -> LocalRollouts:
    """Each prompt's own completions and the partner's completions of the same prompt, as one group."""
    if [p.id for p in own.prompts] != [p.id for p in partner.prompts]:
        raise RuntimeError("compute arms need both peers to draw the same prompts")
    return LocalRollouts(own.prompts, own.prompt_ids, [a + b for a, b in zip(own.samples, partner.samples, strict=True)],
                         [np.concatenate([a, b]) for a, b in zip(own.rewards, partner.rewards, strict=True)])


def jobs_for(exp: str, peer_parts: list[tuple[str, str]], arms: list[str], seeds: list[int]) -> list[tuple]:
    """(experiment, arm, peers, seed) per run: alone arms one job per model, the others all peers together.

    Peer i draws its prompts with task seed i in every arm, so its own-part prompts are the same alone and in
    the swarm (paired); the compute arms give both peers task seed 0: the same prompts."""
    peers = [(m, part, i) for i, (m, part) in enumerate(peer_parts)]
    if exp == "compute":  # the same prompts for both peers: one task seed
        peers = [(m, part, 0) for m, part, _ in peers]
    jobs = []
    for seed in seeds:
        for arm in arms:
            if arm.startswith(("alone", "local")):
                mix = FULL if arm in ("alone:full", "local8", "local4") else arm.split(":", 1)[1]
                jobs.extend((exp, arm, [(m, mix, ts)], seed) for m, _, ts in peers)
            else:
                jobs.append((exp, arm, peers, seed))
    return jobs


def _run_job(job: tuple) -> list[dict]:
    exp, arm, peers, seed, args = job
    return train(exp, arm, peers, seed, args)


# ---- analysis ------------------------------------------------------------------------------------------


def part_labels(n: int) -> list[str]:
    """The part of each of the first n union problems (the same on every node)."""
    from swarm_node.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    return [task.part_of(p) for p in task.eval_prompts("union", n)]


def with_parts(run: dict, labels: list[str]) -> dict:
    """A run with per-part hit lists (hits_end_<part>, hits_start_<part>) and accuracies (end_<part>, ...)."""
    out = dict(run)
    for when in ("start", "end"):
        hits = [c == "1" for c in run[f"hits_{when}"]]
        out[f"hits_{when}_union"] = hits
        out[f"{when}_union"] = run[when]["union"]
        for p in PARTS:
            out[f"hits_{when}_{p}"] = [h for h, lab in zip(hits, labels, strict=True) if lab == p]
            out[f"{when}_{p}"] = run[when][p]
    return out


def by_seed(runs: list[dict], model: str, arm: str) -> dict[int, dict]:
    return {r["seed"]: r for r in runs if r["model"] == model and r["arm"] == arm}


def compare(runs: list[dict], model: str, arm: str, base: str, key: str) -> tuple[float, float, str]:
    """arm - base on one key (union or a part), paired over the seeds both have."""
    a, b = by_seed(runs, model, arm), by_seed(runs, model, base)
    pairs = [(a[s], b[s]) for s in sorted(a) if s in b]
    if not pairs:
        return float("nan"), float("nan"), "cannot tell"
    return paired_difference(pairs, f"end_{key}", f"hits_end_{key}")


def arm_table(runs: list[dict], base_of) -> list[dict]:
    """Per (model, arm): end accuracy per key (mean +- std over seeds) and the paired gain over `base_of(model)`."""
    table = []
    for model in dict.fromkeys(r["model"] for r in runs):
        for arm in dict.fromkeys(r["arm"] for r in runs if r["model"] == model):
            rows = list(by_seed(runs, model, arm).values())
            base = base_of(model, rows[0])
            e = {"model": model, "arm": arm, "part": rows[0]["part"], "seeds": sorted(r["seed"] for r in rows),
                 "base": base, "filtered_share": mean_std([r["filtered_share"] for r in rows])}
            for key in ("union", *PARTS):
                e[f"start_{key}"] = mean_std([r[f"start_{key}"] for r in rows])
                e[f"end_{key}"] = mean_std([r[f"end_{key}"] for r in rows])
                e[f"gain_{key}"] = (float("nan"), float("nan"), "-") if arm == base else compare(runs, model, arm, base, key)
            table.append(e)
    return table


def claims(runs: list[dict], peers: list[tuple[str, str]], swarm_arm: str) -> list[dict]:
    """Claims (a), (b), (c) of the specialties experiment for each peer, with figures and verdicts."""
    out = []
    for model, own in peers:
        alone_own = f"alone:{own}"
        if not by_seed(runs, model, swarm_arm) or not by_seed(runs, model, alone_own):
            continue
        a = compare(runs, model, swarm_arm, alone_own, "union")
        c = compare(runs, model, swarm_arm, "alone:full", "union")
        c_verdict = ("holds" if c[0] - 2 * c[1] >= -0.01 else "does not hold" if c[0] + 2 * c[1] < -0.01
                     else "cannot tell")
        entry = {"model": model, "own": own, "arm": swarm_arm,
                 "a_vs_alone_own": a, "a_verdict": "holds" if a[2] == "higher" else "does not hold",
                 "c_vs_alone_full": c, "c_verdict": c_verdict, "b": {}}
        for p in PARTS:
            if p == own or not by_seed(runs, model, f"alone:{p}"):
                continue
            sw, alone_p = by_seed(runs, model, swarm_arm), by_seed(runs, model, f"alone:{p}")
            seeds = [s for s in sorted(sw) if s in alone_p]
            # gain in the swarm (end - start) minus half the gain of training alone on p, per problem
            margin = linear_contrast([[(1.0, sw[s][f"hits_end_{p}"], sw[s][f"end_{p}"]),
                                       (-0.5, sw[s][f"hits_start_{p}"], sw[s][f"start_{p}"]),
                                       (-0.5, alone_p[s][f"hits_end_{p}"], alone_p[s][f"end_{p}"])] for s in seeds])
            swarm_gain = float(np.mean([sw[s][f"end_{p}"] - sw[s][f"start_{p}"] for s in seeds]))
            self_gain = float(np.mean([alone_p[s][f"end_{p}"] - alone_p[s][f"start_{p}"] for s in seeds]))
            own_part_gain = compare(runs, model, swarm_arm, alone_own, p)  # vs never seeing p at all
            entry["b"][p] = {"swarm_gain": swarm_gain, "self_gain": self_gain, "margin": margin,
                             "vs_alone_own": own_part_gain,
                             "verdict": {"higher": "holds", "lower": "does not hold"}.get(margin[2], "cannot tell")}
        out.append(entry)
    return out


def fmt_gain(g: tuple[float, float, str]) -> str:
    d, se, v = g
    return "-" if np.isnan(d) else f"{d:+.3f} +- {se:.3f}" + (f" {v}" if v not in ("-", "cannot tell") else "")


def print_table(table: list[dict]) -> None:
    keys = ("union", *PARTS)
    print(f"{'model':13s} {'arm':12s} " + " ".join(f"{k + ' end':>15s}" for k in keys) + f" {'vs (base)':>12s} "
          + " ".join(f"{k + ' vs base':>26s}" for k in keys) + f" {'filtered':>8s}")
    for e in table:
        fs = e["filtered_share"][0]
        base = "-" if e["base"] == e["arm"] else e["base"]
        print(f"{e['model']:13s} {e['arm']:12s} " + " ".join(f"{fmt_ms(e[f'end_{k}']):>15s}" for k in keys)
              + f" {base:>12s} "
              + " ".join(f"{fmt_gain(e[f'gain_{k}']):>26s}" for k in keys)
              + f" {'-' if np.isnan(fs) else f'{fs:.3f}':>8s}")


def print_claims(entries: list[dict]) -> None:
    for e in entries:
        d, se, _ = e["a_vs_alone_own"]
        print(f"{e['model']} (samples {e['own']}), {e['arm']}:")
        print(f"  (a) union vs alone on {e['own']}: {d:+.3f} +- {se:.3f} -> {e['a_verdict']}")
        for p, b in e["b"].items():
            m = b["margin"]
            print(f"  (b) {p} (never sampled): gain {b['swarm_gain']:+.3f} in the swarm, {b['self_gain']:+.3f} "
                  f"training alone on {p}; gain - half: {m[0]:+.3f} +- {m[1]:.3f} -> {b['verdict']}; "
                  f"vs alone on {e['own']}: {fmt_gain(b['vs_alone_own'])}")
        d, se, _ = e["c_vs_alone_full"]
        print(f"  (c) union vs alone on the full mix: {d:+.3f} +- {se:.3f} -> {e['c_verdict']} (within 1 point or above)")


def plot(runs: list[dict], path: Path, title: str) -> None:
    """Curves: one row per model, columns union and each part; one line per arm (mean, +-1 std band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in runs))
    keys = ("union", *PARTS)
    fig, axes = plt.subplots(len(models), len(keys), figsize=(3.6 * len(keys), 2.8 * len(models)), squeeze=False)
    for row, model in zip(axes, models, strict=True):
        for ax, key in zip(row, keys, strict=True):
            for arm in dict.fromkeys(r["arm"] for r in runs if r["model"] == model):
                rs = list(by_seed(runs, model, arm).values())
                xs = [x for x, _ in rs[0]["curve"]]
                ys = np.array([[c[key] for _, c in r["curve"]] for r in rs])
                m = ys.mean(axis=0)
                s = ys.std(axis=0, ddof=1) if len(rs) > 1 else np.zeros(len(xs))
                ax.plot(xs, m, label=arm, linestyle="--" if arm.startswith(("alone", "local")) else "-")
                ax.fill_between(xs, m - s, m + s, alpha=0.12)
            ax.set_title(f"{model} ({rs[0]['part']}): {key}", fontsize=8)
            ax.set_xlabel("round", fontsize=8)
            ax.set_ylabel("held-out accuracy", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="specialties", choices=list(EXPERIMENTS))
    add_run_args(ap, seeds=5, quick="8 rounds, 150 union problems (50 per part), curves every 4 rounds on 150; "
                 "the options below still win")
    ap.add_argument("--rounds", type=int, default=None, help="default 60, the demo's (quick: 8)")
    ap.add_argument("--prompts", type=int, default=16, help="own prompts per peer and round")
    ap.add_argument("--eval-n", type=int, default=None, help="union problems scored, a third per part; default 1200 "
                    "(quick: 150)")
    ap.add_argument("--curve-every", type=int, default=None, help="default 10 (quick: 4)")
    ap.add_argument("--curve-n", type=int, default=None, help="default 300 (quick: 150)")
    ap.add_argument("--arms", nargs="+", default=None, help="default: the experiment's arms")
    ap.add_argument("--peers", nargs="+", default=None, metavar="MODEL:PART",
                    help=f"the experiment's peers and the part each samples (models: {', '.join(MODELS)}; parts: "
                    f"{', '.join(PARTS)}, {FULL})")
    ap.add_argument("--lr-scale", type=float, default=1.0, help="each model's default learning rate times this")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                    help="runs in parallel, one process and one thread each (default: 2 or the core count)")
    ap.add_argument("--png", type=Path, default=None, help="also plot the learning curves here")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    sizes = dict(rounds=8, eval_n=150, curve_every=4, curve_n=150) if args.quick else \
        dict(rounds=60, eval_n=1200, curve_every=10, curve_n=300)
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    exp = dict(EXPERIMENTS[args.experiment])
    if args.peers:
        exp["peers"] = [tuple(p.split(":", 1)) for p in args.peers]
        bad = [p for p in exp["peers"] if len(p) != 2 or p[0] not in MODELS or p[1] not in (*PARTS, FULL)]
        if bad:
            ap.error(f"--peers: expected MODEL:PART, got {bad}")
    arms = args.arms or exp["arms"]
    one_thread()
    for m, _ in exp["peers"]:  # build presets once, before any worker needs them
        model_path(m)
    jobs = [(*j, args) for j in jobs_for(args.experiment, exp["peers"], arms, seeds)]
    print(f"{args.experiment}: {len(jobs)} runs ({len(seeds)} seeds x {len(arms)} arms), {args.rounds} rounds, "
          f"{args.prompts} prompts per peer and round, {args.workers} at a time", flush=True)
    t0, results = time.perf_counter(), []

    def report(out: list[dict]) -> None:
        results.extend(out)
        print(f"[{time.perf_counter() - t0:6.0f}s] seed {out[0]['seed']} {out[0]['arm']:12s} " + "  ".join(
            f"{o['model']} ({o['part']}): union {o['start']['union']:.3f}->{o['end']['union']:.3f} "
            + " ".join(f"{p} {o['end'][p]:.3f}" for p in PARTS) for o in out), flush=True)

    run_jobs(_run_job, jobs, args.workers, report)  # in job order: the printout and JSON are deterministic
    labels = part_labels(args.eval_n)
    runs = [with_parts(r, labels) for r in results]
    base_name = {"specialties": "alone:own", "strong": "alone:full", "compute": "local8"}[args.experiment]

    def base_of(model: str, row: dict) -> str:
        if args.experiment == "specialties":
            return f"alone:{row['part']}" if row["arm"] in SWARM_VARIANTS else "alone:full"
        return "alone:full" if args.experiment == "strong" else "local8"

    table = arm_table(runs, base_of)
    print(f"\n{args.rounds} rounds, {args.prompts} prompts per peer and round, held-out union n={args.eval_n} "
          f"({args.eval_n // 3} per part), seeds {seeds}; mean +- std over seeds; gains paired (+- SE); "
          f"swarm arms against {base_name}, alone arms against alone:full\n")
    print_table(table)
    entries = []
    if args.experiment == "specialties":
        print()
        for arm in [a for a in arms if a in SWARM_VARIANTS]:
            got = claims(runs, exp["peers"], arm)
            print_claims(got)
            entries += got
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.png:
        plot(runs, args.png, f"{args.experiment}: {args.rounds} rounds, seeds {seeds[0]}-{seeds[-1]}")
        print(f"curves: {args.png}")
    write_json(args.json, {"args": public_args(args), "seeds": seeds, "part_labels": labels,
                           "table": table, "claims": entries, "runs": results}, args)


if __name__ == "__main__":
    main()
