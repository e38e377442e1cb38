"""benchmarks/dpo_byzantine.py's by-round summary (tooling/byzantine_summary.py): an attack that only delays
learning shows as a gap that closes."""

from __future__ import annotations

from tooling.byzantine_summary import summarize


def _run(mode: str | None, seed: int, hits_by_round: dict[int, dict[int, list[bool]]]) -> dict:
    at = {t: {i: {"acc": sum(h) / len(h), "hits": h} for i, h in nodes.items()} for t, nodes in hits_by_round.items()}
    last = at[max(at)]
    return {"graph": "ring", "rule": "robust", "byzantine": [0] if mode else [], "mode": mode or "none", "seed": seed,
            "acc": sum(v["acc"] for v in last.values()) / len(last), "nodes": last, "at": at, "consensus": [0.1],
            "refused": {}, "refused_per_node_round": 0.0, "clipped_per_node_round": 0.0}


def test_the_worst_node_gap_is_reported_at_every_evaluated_round():
    right, half = [True] * 10, [True] * 5 + [False] * 5
    results = []
    for seed in (0, 1):
        results.append(_run(None, seed, {20: {1: right, 2: right}, 40: {1: right, 2: right}}))
        # node 2 is 50 points behind at round 20 and has caught up by round 40
        results.append(_run("sign_flip", seed, {20: {1: right, 2: half}, 40: {1: right, 2: right}}))
    row = next(r for r in summarize(results, [0, 1])["rows"] if r["mode"] == "sign_flip")
    by_round = row["worst_node_by_round"]
    assert sorted(by_round) == [20, 40]
    assert by_round[20]["node"] == 2 and abs(by_round[20]["diff"] + 0.5) < 1e-9
    assert abs(by_round[40]["diff"]) < 1e-9
    assert row["worst_node"]["diff"] == by_round[40]["diff"]  # the last round is the headline figure
