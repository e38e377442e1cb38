"""`swarm-node launch`: one node per GPU from one config, as real processes. On this CPU machine the GPUs are
only names: each child gets its CUDA_VISIBLE_DEVICES (and runs on the CPU, having no CUDA), its own state dir,
identity, seed and model name, and the two join one swarm through the launcher's local bootstrap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]


def test_launch_runs_one_node_per_gpu_with_its_own_device_state_and_seed(presets_dir, tmp_path):
    root = tmp_path / "gpus"
    sets = ["rounds=3", "task.eval_n=20", "metrics.eval_every=100", "swarm.enabled=true", "swarm.wait_for_peers=1",
            "swarm.host_maddrs=['/ip4/127.0.0.1/tcp/0']", "threads=1"]
    res = subprocess.run([sys.executable, "-m", "swarm_node.cli", "launch", "--config", str(ROOT / "peers" / "tiny-s.yaml"),
                          "--gpus", "0,1", "--state-root", str(root), "--local-bootstrap",
                          *[x for s in sets for x in ("--set", s)]], capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    seeds, names, external = set(), set(), 0
    for gpu in ("0", "1"):
        state = root / f"gpu{gpu}"
        assert f"(CUDA_VISIBLE_DEVICES={gpu})" in (state / "node.log").read_text()
        cfg = yaml.safe_load((state / "config.yaml").read_text())
        seeds.add(cfg["seed"])
        names.add(cfg["model"]["name"])
        assert (state / "identity.key").is_file()
        rows = [json.loads(ln) for ln in (state / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows] == [0, 1, 2, 3]
        external += sum(r["external_groups"] for r in rows)
    assert len(seeds) == 2 and names == {"tiny-s-gpu0", "tiny-s-gpu1"}
    assert external > 0  # one swarm: the nodes trained on each other's groups
