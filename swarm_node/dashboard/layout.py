"""Where a run directory keeps its metrics.jsonl files: one node's state dir, or a demo's output dir.

Layouts: RUN_DIR/metrics.jsonl (one node: arm "node", named after the dir), or RUN_DIR/swarm/<peer>/ and
RUN_DIR/alone/<peer>/ (a `swarm-node demo --out` dir, the alone arm only with --compare-alone). Read by
`swarm-node report` (whole files, once) and the dashboard (files as they grow).
"""

from __future__ import annotations

from pathlib import Path

ARMS = ("swarm", "alone")
NODE_ARM = "node"  # a single node's state dir
EXPECTED = ("a node's --state-dir holding metrics.jsonl, or a `swarm-node demo --out` dir with "
            "swarm/<peer>/metrics.jsonl")


def metrics_files(run_dir: Path) -> dict[str, dict[str, Path]]:
    """{arm: {peer: metrics.jsonl path}} of the files present now (a demo's peers appear as they start)."""
    run_dir = Path(run_dir)
    single = run_dir / "metrics.jsonl"
    if single.is_file():
        return {NODE_ARM: {run_dir.resolve().name: single}}
    out: dict[str, dict[str, Path]] = {}
    for arm in ARMS:
        d = run_dir / arm
        if not d.is_dir():
            continue
        peers = {p.name: p / "metrics.jsonl" for p in sorted(d.iterdir()) if (p / "metrics.jsonl").exists()}
        if peers:
            out[arm] = peers
    return out
