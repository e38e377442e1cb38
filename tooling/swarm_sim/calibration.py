"""The simulator against the real benchmark: benchmarks/swarm_scale.py's control bytes per node and round at
4-32 peers (docs/data/swarm_scale_final.json and swarm_scale_32.json), reproduced with its own setup and
nothing fitted to them."""

from __future__ import annotations

import json
from pathlib import Path

from tooling.swarm_sim.costs import Costs
from tooling.swarm_sim.world import SimConfig, simulate

DATA = Path(__file__).resolve().parents[2] / "docs" / "data"
FULL_RUNS = ("swarm_scale_final.json", "swarm_scale_32.json")  # today's code (full membership)
TOLERANCE = 0.15


def measured_full(data: Path = DATA) -> dict[int, float]:
    """Peers -> measured control bytes per node and round, today's code."""
    out: dict[int, float] = {}
    for name in FULL_RUNS:
        for row in json.loads((data / name).read_text())["results"]:
            out[int(row["n"])] = float(row["control_bytes_per_node_round"])
    return dict(sorted(out.items()))


def swarm_scale_config(nodes: int, arm: str, seed: int = 0) -> SimConfig:
    """benchmarks/swarm_scale.py's run: joins 1 s apart, 15 s warm-up, 40 s measured, K = F = 3, localhost."""
    return SimConfig(nodes=nodes, arm=arm, k=3, fanout=3, warmup_s=15.0, measure_s=40.0, batch_bytes=3700,
                     profile="localhost", calibration=True, seed=seed)


def calibration_rows(costs: Costs | None = None, arm: str = "full", seed: int = 0,
                     measured: dict[int, float | None] | None = None) -> list[dict]:
    """One row per measured size: simulated vs measured control bytes, the relative error, and the simulated
    components (what to compare first when a row misses)."""
    measured = measured_full() if measured is None else measured
    rows = []
    for n, real in measured.items():
        res = simulate(swarm_scale_config(n, arm, seed), costs)
        sim = res.control_bytes_per_node_round
        rows.append({"n": n, "arm": arm, "simulated": sim, "measured": real, "error": None if real is None else sim / real - 1,
                     "batches_per_round": res.batches_per_round, "components": res.components})
    return rows


def within_tolerance(rows: list[dict], tolerance: float = TOLERANCE) -> bool:
    return all(r["error"] is not None and abs(r["error"]) <= tolerance for r in rows)
