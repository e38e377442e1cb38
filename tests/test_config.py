"""Config: YAML loading, CLI overrides, and error messages that name the key, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_node.config import load_config
from swarm_node.config_docs import render
from swarm_node.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "node.yaml"
    p.write_text(text)
    return p


def test_good_yaml_loads_with_overrides(tmp_path):
    p = write(tmp_path, """
mode: grpo
rounds: 5
model: {path: tiny-m, lora: {enabled: true, r: 4}}
training: {variant: tis, cap: 3.0}
swarm: {enabled: true, initial_peers: ["/ip4/127.0.0.1/tcp/1/p2p/QmX"]}
""")
    cfg = load_config(p, ["training.lr=0.001", "generation.num_generations=4"])
    assert cfg.rounds == 5 and cfg.model.path == "tiny-m" and cfg.model.lora.r == 4
    assert cfg.training.variant == "tis" and cfg.training.cap == 3.0 and cfg.training.lr == 0.001
    assert cfg.generation.num_generations == 4
    assert cfg.swarm.initial_peers == ["/ip4/127.0.0.1/tcp/1/p2p/QmX"]


def test_every_peer_example_loads():
    files = sorted((ROOT / "peers").glob("*.yaml"))
    assert files
    for f in files:
        load_config(f)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("training: {varient: ftis}", ["training.varient", "unknown key"]),
        ("bogus: 1", ["bogus", "unknown key"]),
        ("training: {variant: magic}", ["training.variant", "'magic'", "'ftis'"]),
        ("generation: {num_generations: 1}", ["generation.num_generations", "1", "greater than or equal to 2"]),
        ("training: {cap: -1}", ["training.cap", "-1", "greater than 0"]),
        ("swarm: {swarm_id: 'has space'}", ["swarm.swarm_id", "has space", "pattern"]),
        ("rounds: many", ["rounds", "many", "integer"]),
        ("task: {name: gsm8k}", ["task.data_path", "gsm8k"]),
        ("- a list", ["top level must be a mapping"]),
    ],
)
def test_bad_key_or_value_is_named(tmp_path, text, needles):
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, text))
    msg = str(exc.value)
    for n in needles:
        assert n in msg, msg


def test_bad_override_is_named():
    with pytest.raises(ConfigError, match="training.lr"):
        load_config(None, ["training.lr=-3"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["training.lr"])
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/node.yaml")


def test_docs_configuration_matches_code():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == render(), "docs/configuration.md is stale: run `python -m swarm_node.config_docs > docs/configuration.md`"


def test_cli_reports_config_error_without_traceback(tmp_path, capsys):
    from swarm_node.cli import main

    p = write(tmp_path, "training: {variant: magic}")
    assert main(["run", "--config", str(p), "--state-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "training.variant" in err and "Traceback" not in err
