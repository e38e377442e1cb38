"""Honest GRPO nodes under attack (issue 11): every mode of the misbehaving peer in tests/adversary.py.

Per seed, two swarms run side by side on 127.0.0.1 (each a bootstrap and one honest tiny-s node with the
same seed); the second also has the adversary, which runs every attack mode one after another. Prints per
attack the rejections the honest node counted, by reason, and whether they are what the attack must
cause; then the honest node's rounds per second against the baseline's (after round 1), whether parameters
stayed finite, and the accuracy difference against the same seeded run without the attacker (mean over
the common eval points; over seeds: mean +- SE and a verdict, "cannot tell" with one seed).

    python -m benchmarks.attack [--quick] [--seeds N] [--rounds-per-mode R] [--json F]

The adversary is a test helper (tests/adversary.py), not part of the package: run from the repository root.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

from benchmarks.args import add_run_args, resolve_seeds, write_json
from swarm_node.runs.stats import seeds_se, verdict
from tests.adversary import MODES, run_side_by_side, summarize


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
    args = ap.parse_args()
    seeds = resolve_seeds(args)
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
                                   seed=seed, timeout_s=900)
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
