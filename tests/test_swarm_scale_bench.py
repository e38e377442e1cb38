"""A smoke run of benchmarks/swarm_scale.py's arms: both memberships at each size, in one run and one JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_membership_arms_interleave_per_size_and_each_has_its_own_ratio(tmp_path):
    out = tmp_path / "arms.json"
    res = subprocess.run([sys.executable, "-m", "benchmarks.swarm_scale", "--nodes", "2", "3", "--membership", "full",
                          "sampled", "--warmup-s", "1", "--measure-s", "3", "--join-s-per-node", "0", "--no-netns",
                          "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["arms"] == ["full", "sampled"]
    rows = data["results"]
    # every arm at a size before the next size, and each node ran with its arm's membership
    assert [(r["n"], r["membership"]) for r in rows] == [(2, "full"), (2, "sampled"), (3, "full"), (3, "sampled")]
    assert all(r["membership_seen"] == [r["membership"]] and r["completed"] == r["n"] for r in rows)
    for arm in ("full", "sampled"):  # the ratio is against the arm's own smallest size
        small, big = (r for r in rows if r["membership"] == arm)
        assert small["control_ratio_vs_smallest"] == pytest.approx(1.0)
        assert big["control_ratio_vs_smallest"] == pytest.approx(
            big["control_bytes_per_node_round"] / small["control_bytes_per_node_round"])
    assert "| full: control B/node/round |" in res.stdout and "| sampled: x vs 2 |" in res.stdout
