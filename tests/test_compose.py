"""compose.yaml is validated as a file here (no Docker engine on CI): its commands must parse with the real
CLI and name peer configs that exist and load."""

from __future__ import annotations

from pathlib import Path

import yaml

from swarm_node.cli import build_parser
from swarm_node.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_compose_topology_and_commands():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert "bootstrap" in services
    peers = [name for name in services if name != "bootstrap"]
    assert len(peers) >= 3
    parser = build_parser()
    boot = parser.parse_args(services["bootstrap"]["command"][1:])
    assert boot.command == "bootstrap" and boot.maddrs_file
    for name in peers:
        cmd = services[name]["command"]
        assert cmd[0] == "swarm-node"
        args = parser.parse_args(cmd[1:])
        assert args.command == "run"
        assert str(args.initial_peers_file) == boot.maddrs_file, "peers must read the file the bootstrap writes"
        local = ROOT / str(args.config).removeprefix("/app/")
        assert local.is_file(), f"{name}: {args.config} does not exist in the repo"
        cfg = load_config(local)
        assert cfg.mode == "grpo" and cfg.swarm.enabled
    # heterogeneous: at least two different models and one LoRA peer
    cfgs = [load_config(ROOT / str(parser.parse_args(services[n]["command"][1:]).config).removeprefix("/app/"))
            for n in peers]
    assert len({c.model.path for c in cfgs}) >= 2
    assert any(c.model.lora.enabled for c in cfgs)


def test_dockerfile_installs_the_package():
    text = (ROOT / "Dockerfile").read_text()
    assert "pip install" in text and "COPY peers" in text and "COPY swarm_node" in text
