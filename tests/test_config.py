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


def test_precedence_is_file_then_environment_then_set(tmp_path, monkeypatch):
    p = write(tmp_path, "rounds: 3\ntraining: {lr: 0.1, cap: 3.0}\n")
    env = {"SWARM_NODE__TRAINING__LR": "0.01", "SWARM_NODE__ROUNDS": "7", "SWARM_NODE_PRESETS": "/not/a/key"}
    cfg = load_config(p, [], environ=env)
    assert cfg.training.lr == 0.01 and cfg.rounds == 7  # env beats the file
    assert cfg.training.cap == 3.0  # keys the env does not name keep the file's value
    cfg = load_config(p, ["training.lr=0.001"], environ=env)
    assert cfg.training.lr == 0.001 and cfg.rounds == 7  # --set beats the env
    # the real process environment is read by default (what `swarm-node run` and demo peers see)
    monkeypatch.setenv("SWARM_NODE__GENERATION__TEMPERATURE", "0.5")
    monkeypatch.setenv("SWARM_NODE__SWARM__INITIAL_PEERS", '["/ip4/127.0.0.1/tcp/1/p2p/QmX"]')
    cfg = load_config(p)
    assert cfg.generation.temperature == 0.5 and cfg.swarm.initial_peers == ["/ip4/127.0.0.1/tcp/1/p2p/QmX"]


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError) as exc:
        load_config(None, [], environ={"SWARM_NODE__TRAINING__LR": "-1"})
    assert "training.lr" in str(exc.value) and "SWARM_NODE__TRAINING__LR" in str(exc.value)
    with pytest.raises(ConfigError, match="unknown key 'training.lrr'"):
        load_config(None, [], environ={"SWARM_NODE__TRAINING__LRR": "1"})


def test_trl_names_are_accepted_where_the_meaning_is_the_same(tmp_path):
    p = write(tmp_path, """
training: {learning_rate: 2.0e-6, max_grad_norm: 0.5, epsilon: 0.3, num_iterations: 2, lr_scheduler_type: cosine}
generation: {max_completion_length: 16}
dpo: {learning_rate: 1.0e-5, per_device_train_batch_size: 4}
rounds: 10
""")
    cfg = load_config(p)
    t = cfg.training
    assert (t.lr, t.grad_clip, t.clip_eps, t.steps_per_round, t.lr_schedule) == (2e-6, 0.5, 0.3, 2, "cosine")
    assert cfg.generation.max_new_tokens == 16 and cfg.dpo.lr == 1e-5 and cfg.dpo.batch_size == 4
    cfg = load_config(p, ["training.learning_rate=3e-6"], environ={"SWARM_NODE__GENERATION__MAX_COMPLETION_LENGTH": "5"})
    assert cfg.training.lr == 3e-6 and cfg.generation.max_new_tokens == 5
    with pytest.raises(ConfigError, match="both 'training.lr' and its TRL name 'training.learning_rate'"):
        load_config(write(tmp_path, "training: {lr: 0.1, learning_rate: 0.2}"))


def test_every_trl_alias_points_at_a_real_key():
    from swarm_node.config import TRL_ALIASES, NodeConfig

    for section, names in TRL_ALIASES.items():
        fields = NodeConfig.model_fields[section].annotation.model_fields
        for alias, ours in names.items():
            assert ours in fields and alias not in fields, (section, alias, ours)


def test_report_to_and_lr_schedule_settings():
    assert load_config(None, ["metrics.report_to=all"]).metrics.report_to == ["tensorboard", "wandb"]
    assert load_config(None, ["metrics.report_to=none"]).metrics.report_to == []
    assert load_config(None, ["metrics.report_to=tensorboard"]).metrics.report_to == ["tensorboard"]
    with pytest.raises(ConfigError, match="metrics.report_to"):
        load_config(None, ["metrics.report_to=[mlflow]"])
    assert load_config(None).metrics.prometheus_host == "127.0.0.1"
    with pytest.raises(ConfigError, match="lr_schedule='cosine' decays towards round `rounds`"):
        load_config(None, ["training.lr_schedule=cosine"])
    cfg = load_config(None, ["training.lr_schedule=linear", "training.warmup_rounds=3", "rounds=20"])
    assert cfg.training.lr_schedule == "linear" and cfg.training.warmup_rounds == 3


def test_push_fanout_defaults_to_k_plus_one_and_a_set_value_wins():
    from swarm_node.config import SwarmConfig
    assert SwarmConfig().fanout() == SwarmConfig().max_peers_per_round + 1 == 5
    assert SwarmConfig(max_peers_per_round=8).fanout() == 9
    assert SwarmConfig(max_peers_per_round=8, push_fanout=3).fanout() == 3
