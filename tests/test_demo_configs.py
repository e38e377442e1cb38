"""`swarm-node demo`'s per-peer configs (no processes): --seed moves every peer to a new seed, the arms differ
only in swarm.enabled, and without --seed the configs keep their own seeds."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from swarm_node.commands import demo

PEERS = Path(__file__).resolve().parents[1] / "peers"


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    return p.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


def _seeds(peers) -> dict[str, int]:
    return {p.name: yaml.safe_load(p.config.read_text()).get("seed", 0) for p in peers}


def test_seed_offsets_every_peer_and_both_arms_alike(tmp_path: Path) -> None:
    templates = [PEERS / "tiny-s.yaml", PEERS / "tiny-s-lora.yaml"]
    own = {t.stem: (yaml.safe_load(t.read_text()) or {}).get("seed", 0) for t in templates}
    plain = _seeds(demo.peer_configs("swarm", _args(), templates, tmp_path / "a"))
    assert plain == own
    seeded = demo.peer_configs("swarm", _args(seed=2), templates, tmp_path / "b")
    alone = demo.peer_configs("alone", _args(seed=2), templates, tmp_path / "b")
    assert _seeds(seeded) == {k: v + 2000 for k, v in own.items()} == _seeds(alone)
    cfg_s, cfg_a = (yaml.safe_load(x.config.read_text()) for x in (seeded[0], alone[0]))
    assert cfg_s["swarm"]["enabled"] is True and cfg_a["swarm"]["enabled"] is False
    cfg_s["swarm"].pop("enabled"), cfg_a["swarm"].pop("enabled")
    assert cfg_s == cfg_a
