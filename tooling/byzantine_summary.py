"""A Byzantine DPO run's summary: honest accuracy, consensus and refusals per graph, attackers, mode and rule,
and what each attack cost, paired per problem against the same seeds with no attacker (or with the hostile
slots silent). Shared by benchmarks/dpo_byzantine.py, which runs the swarms, and
tests/test_dpo_byzantine_bench.py, which checks the by-round figures on made-up runs.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from swarm_node.runs.stats import mean_std, paired_difference

ABSENT = "absent"  # a reference, not an attack: the hostile slots publish nothing (what refusing them leaves)


def worst_node(runs: list[dict], base: dict[int, dict]) -> tuple[float, float, str, int]:
    """The honest node whose accuracy fell most against the no-attack run, paired over seeds and pairs."""
    out = None
    for i in runs[0]["nodes"]:
        d, se, v = paired_difference([(r["nodes"][i], base[r["seed"]]["nodes"][i]) for r in runs], "acc", "hits")
        if out is None or d < out[0]:
            out = (d, se, v, i)
    return out


def summarize(results: list[dict], seeds: list[int]) -> dict:
    key = lambda r: (r["graph"], len(r["byzantine"]), r["mode"], r["rule"])  # noqa: E731
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    rows = []
    for (graph, f, mode, rule), runs in sorted(groups.items()):
        base = {r["seed"]: r for r in groups.get((graph, 0, "none", rule), [])}
        row = {"graph": graph, "attackers": f, "mode": mode, "rule": rule, "seeds": len(runs),
               "acc": mean_std([r["acc"] for r in runs]),
               "consensus": mean_std([r["consensus"][-1] for r in runs]),
               "refused_per_node_round": float(np.mean([r["refused_per_node_round"] for r in runs])),
               "clipped_per_node_round": float(np.mean([r["clipped_per_node_round"] for r in runs])),
               "refused": dict(sum((Counter(r["refused"]) for r in runs), Counter()))}
        if f and all(r["seed"] in base for r in runs):
            # the same honest nodes in the no-attack run: attack runs replace nodes by attackers
            d, se, v, node = worst_node(runs, {s: {"nodes": {i: base[s]["nodes"][i] for i in runs[0]["nodes"]}}
                                               for s in base})
            row["worst_node"] = {"node": node, "diff": d, "se": se, "verdict": v}
            row["worst_node_by_round"] = _worst_by_round(runs, base)
            row["within_2_points"] = d >= -0.02
            absent = {r["seed"]: r for r in groups.get((graph, f, ABSENT, rule), [])}
            if mode != ABSENT and all(r["seed"] in absent for r in runs):
                # the same rule with the hostile slots silent: what refusing them at once would leave
                row["vs_absent"] = dict(zip(("diff", "se", "verdict"), paired_difference(
                    [(_pooled(r), _pooled(absent[r["seed"]])) for r in runs], "acc", "hits"), strict=True))
        rows.append(row)
    cost = {}
    for graph in sorted({r["graph"] for r in results}):
        plain = {r["seed"]: r for r in groups.get((graph, 0, "none", "plain"), [])}
        robust = groups.get((graph, 0, "none", "robust"), [])
        if robust and all(r["seed"] in plain for r in robust):
            d, se, v = paired_difference([(_pooled(r), _pooled(plain[r["seed"]])) for r in robust], "acc", "hits")
            cost[graph] = {"acc_diff": d, "se": se, "verdict": v,
                           "consensus_ratio": float(np.mean([r["consensus"][-1] for r in robust]) /
                                                    np.mean([plain[r["seed"]]["consensus"][-1] for r in robust]))}
    return {"rows": rows, "no_attack_cost": cost}


def _worst_by_round(runs: list[dict], base: dict[int, dict]) -> dict[int, dict]:
    """The worst honest node against the no-attack run at every round both were evaluated at: whether
    what an attack costs is lost for good or only delays learning."""
    common = set.intersection(*(set(r["at"]) for r in runs), *(set(b["at"]) for b in base.values()))
    out = {}
    for t in sorted(common):
        d, se, v, node = worst_node([r | {"nodes": r["at"][t]} for r in runs],
                                    {s: {"nodes": {i: b["at"][t][i] for i in runs[0]["at"][t]}} for s, b in base.items()})
        out[t] = {"node": node, "diff": d, "se": se, "verdict": v}
    return out


def _pooled(run: dict) -> dict:
    """A run's honest nodes as one arm: mean accuracy, and every node's hits one after another."""
    return {"acc": run["acc"], "hits": [h for i in sorted(run["nodes"]) for h in run["nodes"][i]["hits"]]}
