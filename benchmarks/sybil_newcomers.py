"""What the newcomer gate (grpo.defences.NewcomerGate) buys against Sybils, and what it costs honest newcomers.

A pure simulation (tooling/newcomer_rounds.py) of one receiving node's round choice: the real Intake
(swarm/intake.py) and the real gate, driven round by round with the node's own order (take K ranked offers; admit; every batch here
passes its checks, so the only thing an attacker spends is identities). Scenarios:

- cold start: H honest peers, all new at round 1: slots used per round (the gate's cost to a new swarm);
- flood: 3 honest peers (established by round 6), then S fresh Sybil identities every round from round 8:
  the honest share of the slots used (what the gate buys);
- late newcomer: an honest peer first heard in round 8 behind N queued newcomers (Sybils), with the flood
  going on: rounds until it is first used, and until it is established;
- patient Sybils: 3 honest peers and the same S Sybil identities from round 8 for `--patient-rounds`
  rounds, the attacker's compute (in honest peers' worth of completions a round) split evenly over its
  identities: the honest share of the slots and honest batches used a round, uniform draw of the
  established slots (volume power 0, before) against the verified-volume draw (power 1, and 2: the
  default, which the other scenarios' gate uses);
- uneven honest peers: 8 honest peers, half of them sending half the completions a batch: their share
  of the slots, by power (what the volume draw costs an honest swarm).

    python -m benchmarks.sybil_newcomers [--k 4] [--sybils 40] [--seeds 3] [--json F]
"""

from __future__ import annotations

import argparse
import random

import numpy as np

from swarm_node.grpo.defences import NewcomerGate
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json
from tooling.newcomer_rounds import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--honest", type=int, default=8)
    ap.add_argument("--sybils", type=int, default=40)
    ap.add_argument("--queued", type=int, nargs="+", default=[0, 10, 40])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--patient-rounds", type=int, default=200)
    ap.add_argument("--budgets", type=float, nargs="+", default=[1.0, 3.0, 40.0],
                    help="patient Sybils' compute, in honest peers' worth of completions a round")
    add_run_args(ap, seeds=3, quick_seeds=1, quick="one seed", seeds_help="simulations per scenario (the gate's and intake's seeds)")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    k = args.k

    def gate(seed=0, power=None):  # GRPONode's max_new, and its volume power unless given
        extra = {} if power is None else {"volume_power": power}
        return NewcomerGate(max_new=max(1, k // 4), rng=random.Random(seed), **extra)

    out: dict = {"k": k, "max_new": max(1, k // 4), "established_after": gate().established_after}
    honest = [f"h{i}" for i in range(args.honest)]
    cold = {}
    for name, g in (("without gate", None), ("with gate", "g")):
        per = np.mean([[len(u) for u in simulate(10, lambda r: honest, k, gate() if g else None, s)] for s in seeds], 0)
        cold[name] = [round(float(x), 2) for x in per]
    out["cold_start_slots_per_round"] = cold
    print(f"cold start, {args.honest} honest peers new at round 1, K={k}: external batches used in rounds 1..10")
    for name, v in cold.items():
        print(f"  {name:<13} {v}")

    three = ["h0", "h1", "h2"]

    def flood(r):
        return three + ([f"s{r}-{i}" for i in range(args.sybils)] if r >= 8 else [])

    flood_share = {}
    for name, g in (("without gate", None), ("with gate", "g")):
        shares = []
        for s in seeds:
            used = simulate(args.rounds, flood, k, gate(s) if g else None, s)[8:]
            shares.append(sum(p in three for u in used for p in u) / max(1, sum(len(u) for u in used)))
        flood_share[name] = round(float(np.mean(shares)), 3)
    out["flood_honest_share"] = flood_share
    print(f"\nflood: 3 established honest peers, {args.sybils} fresh Sybil identities a round from round 8: "
          f"honest share of slots used (rounds 9..{args.rounds})")
    for name, v in flood_share.items():
        print(f"  {name:<13} {v:.3f}")

    def persistent(r):  # the same Sybil identities every round: they establish, one slot at a time
        return three + ([f"p{i}" for i in range(args.sybils)] if r >= 8 else [])

    kept = {}
    for name, g in (("without gate", None), ("with gate", "g")):
        per = {}
        for span in ((9, 30), (31, 100)):
            shares = []
            for s in seeds:
                used = simulate(span[1], persistent, k, gate(s) if g else None, s)[span[0] - 1:]
                shares.append(sum(p in three for u in used for p in u) / max(1, sum(len(u) for u in used)))
            per[f"rounds {span[0]}..{span[1]}"] = round(float(np.mean(shares)), 3)
        kept[name] = per
    out["persistent_sybils_honest_share"] = kept
    print(f"\npersistent Sybils: the same {args.sybils} identities every round from round 8 (they pass every check, "
          f"so they establish): honest share of slots used")
    for name, v in kept.items():
        print(f"  {name:<13} " + ", ".join(f"{a}: {b:.3f}" for a, b in v.items()))

    late = {}
    print(f"\nlate honest newcomer, first heard in round 8 behind N newcomers heard before it (K={k}, "
          f"{args.sybils} new Sybils a round): rounds until first used / established (with gate)")
    for n in args.queued:
        firsts, ests = [], []
        for s in seeds:
            g = gate(s)

            def peers(r, n=n):
                ps = list(three) + [f"q{i}" for i in range(n)] if r >= 8 else list(three)
                if r >= 8:
                    ps.append("late")
                return ps + ([f"s{r}-{i}" for i in range(args.sybils)] if r >= 8 else [])
            used = simulate(200, peers, k, g, s)
            hit = [r + 1 for r, u in enumerate(used) if "late" in u]
            firsts.append(hit[0] - 8 if hit else float("nan"))
            ests.append(hit[g.established_after - 1] - 8 if len(hit) >= g.established_after else float("nan"))
        late[n] = {"first_used": float(np.mean(firsts)), "established": float(np.mean(ests))}
        print(f"  N={n:<4} first used after {late[n]['first_used']:.1f} rounds, established after "
              f"{late[n]['established']:.1f}")
    out["late_newcomer"] = late
    out["patient_sybils"] = patient(args, seeds, k, gate, three)
    out["uneven_honest"] = uneven(args, seeds, k, gate)
    write_json(args.json, out, args)


PER_BATCH = 32  # an honest peer's completions a batch (4 prompts x G = 8, the default task)
SPANS = ((9, 50), (51, 100), (101, 200))
POWERS = (0.0, 1.0, 2.0)  # 0: the uniform draw (before); 1: splitting neither pays nor costs; 2: the default


def patient(args, seeds, k: int, gate, three: list[str]) -> dict:
    """Honest share of the slots (and honest batches a round) beside the same Sybil identities every round."""
    rounds = args.patient_rounds
    spans = [(a, min(b, rounds)) for a, b in SPANS if a <= rounds]
    print(f"\npatient Sybils: 3 honest peers ({PER_BATCH} completions a batch), the same {args.sybils} identities "
          f"from round 8 for {rounds} rounds, the attacker's compute split evenly over them (K={k})")
    res: dict = {}
    for budget in args.budgets:
        per_id = max(1, round(budget * PER_BATCH / args.sybils))

        def peers(r):
            return three + ([f"p{i}" for i in range(args.sybils)] if r >= 8 else [])

        def completions_of(pid, per_id=per_id):
            return PER_BATCH if pid in three else per_id

        row = {}
        for power in POWERS:
            used = [simulate(rounds, peers, k, gate(s, power), s, completions_of) for s in seeds]
            cell = {}
            for a, b in spans:
                share = [sum(p in three for u in us[a - 1:b] for p in u) / max(1, sum(len(u) for u in us[a - 1:b]))
                         for us in used]
                honest = [np.mean([sum(p in three for p in u) for u in us[a - 1:b]]) for us in used]
                cell[f"rounds {a}..{b}"] = {"honest_share": round(float(np.mean(share)), 3),
                                            "honest_batches_per_round": round(float(np.mean(honest)), 2)}
            row[f"power {power:g}"] = cell
        res[f"budget {budget:g}"] = {"completions_per_identity": per_id, **row}
        print(f"  attacker = {budget:g} honest peers' compute ({per_id} completions per identity a batch):")
        for name in (f"power {p:g}" for p in POWERS):
            print(f"    {name}: " + ", ".join(f"{span} share {v['honest_share']:.3f} ({v['honest_batches_per_round']:.2f}"
                                             f" honest a round)" for span, v in row[name].items()))
    return res


def uneven(args, seeds, k: int, gate) -> dict:
    """8 honest peers, 4 of them sending half the completions: the share of slots those 4 get."""
    peers = [f"h{i}" for i in range(8)]
    small = set(peers[4:])
    res = {}
    for power in POWERS:
        shares = []
        for s in seeds:
            used = simulate(100, lambda r: peers, k, gate(s, power), s,
                            lambda pid: PER_BATCH // 2 if pid in small else PER_BATCH)[10:]
            shares.append(sum(p in small for u in used for p in u) / max(1, sum(len(u) for u in used)))
        res[f"power {power:g}"] = round(float(np.mean(shares)), 3)
    print(f"\nuneven honest peers: 8, 4 of them with {PER_BATCH // 2} completions a batch instead of {PER_BATCH} "
          f"(K={k}): their share of the slots, rounds 11..100 (0.5 is even)")
    for name, v in res.items():
        print(f"  {name}: {v:.3f}")
    return res


if __name__ == "__main__":
    main()
