"""Honest GRPO nodes under attack (issue 11): every mode of the misbehaving peer in tooling/adversary.py.

Per seed, two swarms run side by side on 127.0.0.1 (each a bootstrap and one honest tiny-s node with the
same seed); the second also has the adversary, which runs every attack mode one after another. Prints per
attack the rejections the honest node counted, by reason, and whether they are what the attack must
cause; then the honest node's rounds per second against the baseline's (after round 1), whether parameters
stayed finite, and the accuracy difference against the same seeded run without the attacker (mean over
the common eval points; over seeds: mean +- SE and a verdict, "cannot tell" with one seed).

    python -m benchmarks.attack [--quick] [--seeds N] [--rounds-per-mode R] [--json F]
    python -m benchmarks.attack --modes long_completions --rounds-per-mode 20 [--honest-set K=V ...]

Per mode it also prints the median round time of both honest nodes over the mode's window, side by side
(`--honest-set admission.max_tokens_per_peer=0` turns the token budget off, to see what it saves).

The adversary (tooling/adversary.py) is shared with the tests, not in the package: run from the checkout root.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

from swarm_node.runs.stats import seeds_se, verdict
from tooling.adversary import MODES, run_side_by_side, summarize
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json


def parse_set(kv: str) -> tuple[str, object]:
    """KEY=VALUE -> (key, the value read as YAML), as `swarm-node run --set` reads it."""
    import yaml

    key, sep, value = kv.partition("=")
    if not sep or not key:
        raise SystemExit(f"--honest-set wants KEY=VALUE, got {kv!r}")
    return key, yaml.safe_load(value)


def presets_root() -> Path:
    """The presets cache ($SWARM_NODE_PRESETS, else the user's cache) with tiny-s built, exported to the nodes."""
    from swarm_node.models.factory import ensure_preset
    from swarm_node.models.presets import default_presets_dir

    root = default_presets_dir()
    ensure_preset("tiny-s", root)
    os.environ["SWARM_NODE_PRESETS"] = str(root)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, seeds=1, first_seed=1, quick="a subset of modes")
    ap.add_argument("--rounds-per-mode", type=int, default=1)
    ap.add_argument("--modes", default="", help="comma-separated (default: all)")
    ap.add_argument("--honest-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override of both honest nodes (YAML value), e.g. admission.max_tokens_per_peer=0")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    overrides = dict(parse_set(kv) for kv in args.honest_set)
    modes = args.modes.split(",") if args.modes else list(MODES)
    if args.quick:
        modes = modes if args.modes else ["false_rewards", "zstd_bomb", "replay_reencoded", "fabricate_positive",
                                          "sybil", "junk_requests"]
    results = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        presets = presets_root()
        for seed in seeds:
            t0 = time.monotonic()
            run = run_side_by_side(tmp / f"seed{seed}", presets, modes=modes, rounds_per_mode=args.rounds_per_mode,
                                   seed=seed, timeout_s=900, overrides=overrides)
            s = summarize(run)
            s["seed"], s["wall_s"], s["codes"] = seed, round(time.monotonic() - t0, 1), run["codes"]
            s["errors"] = run["report"].get("errors", [])
            s["mean_acc_delta"] = sum(s["acc_delta"]) / len(s["acc_delta"]) if s["acc_delta"] else float("nan")
            results.append(s)
            print(f"seed {seed}: {s['rounds']} rounds, pace {s['pace_ratio']:.3f}, wall {s['wall_s']} s, "
                  f"exit {run['codes']}", flush=True)
    print(f"\n{'attack':<20} {'counted':>8}  rejections by reason (summed over seeds)")
    for m in modes:
        reasons: dict[str, int] = {}
        hits = 0
        for s in results:
            got = s["modes"].get(m, {"reasons": {}, "counted": False})
            hits += int(got["counted"])
            for k, v in got["reasons"].items():
                reasons[k] = reasons.get(k, 0) + v
        want = ", ".join(MODES[m]) or "(nothing required)"
        shown = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "-"
        print(f"{m:<20} {hits:>3}/{len(results):<4}  {shown}   [must: {want}]")
    print(f"\n{'attack':<20} median round s over the mode's window, baseline / attacked (train s; rounds), per seed")
    print(f"{'':<20} (a round that took the adversary's batch: trained on its groups, or capped some)")
    for m in modes:
        cells = []
        for s in results:
            t = s["modes"].get(m, {}).get("timing")
            if t:
                b, a = t["baseline"], t["attacked"]
                cells.append(f"{b['round_s']} / {a['round_s']} (train {b['train_s']} / {a['train_s']}; "
                             f"{b['rounds']} / {a['rounds']}); the {a['took_rounds']} attacked rounds that took "
                             f"its batch: {a['took_round_s']} s (train {a['took_train_s']}, exchange "
                             f"{a['took_exchange_s']})")
        print(f"{m:<20} " + "; ".join(cells))
    paces = [s["pace_ratio"] for s in results]
    deltas = [s["mean_acc_delta"] for s in results]
    mean_d = sum(deltas) / len(deltas)
    se = seeds_se(deltas)
    print(f"\nhonest pace, attacked / baseline rounds per second after round 1 (side by side): "
          f"{', '.join(f'{p:.3f}' for p in paces)}; first round (s), baseline / attacked: "
          + ", ".join(f"{s['first_round_s']['baseline']} / {s['first_round_s']['attacked']}" for s in results))
    print(f"params finite: {all(all(s['params_finite'].values()) for s in results)}; "
          f"loss finite: {all(s['loss_finite'] for s in results)}")
    print(f"accuracy, attacked - baseline (mean over eval points): {mean_d:+.3f}"
          + ("" if math.isnan(se) else f" +- {se:.3f}") + f" -> {verdict(mean_d, se)}; "
          f"largest |difference| at one eval point: {max(s['max_abs_acc_delta'] for s in results):.3f}")
    write_json(args.json, {"seeds": seeds, "modes": modes, "results": results}, args)


if __name__ == "__main__":
    main()
