"""`swarm-node demo`'s per-peer configs (no processes): --seed moves every peer to a new seed, the arms differ
only in swarm.enabled, and without --seed the configs keep their own seeds."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from swarm_node.commands import demo

PEERS = Path(__file__).resolve().parents[1] / "peers"


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    flags = [(f"--{k.replace('_', '-')}", v) for k, v in kw.items()]
    return p.parse_args([flag if v is True else f"{flag}={v}" for flag, v in flags])


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


def test_real_model_peers_size_their_own_demo(tmp_path: Path) -> None:
    """peers/smollm2-*.yaml carry their rounds and eval period; the tiny peers keep the demo's 60 rounds. The
    demo only overrides them when asked (--rounds, --eval-every)."""
    from swarm_node.config import load_config

    real = [PEERS / "smollm2-135m.yaml", PEERS / "smollm2-135m-lora.yaml"]
    cfgs = [load_config(t) for t in real]
    assert demo.default_rounds(real) == max(c.rounds for c in cfgs) and demo.default_rounds([PEERS / "tiny-s.yaml"]) == 60
    assert cfgs[0].task == cfgs[1].task and cfgs[0].generation == cfgs[1].generation  # peers must pose problems alike
    assert cfgs[1].model.lora.enabled and cfgs[1].model.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    peers = demo.peer_configs("swarm", _args(rounds=cfgs[0].rounds), real, tmp_path)
    written = [yaml.safe_load(p.config.read_text()) for p in peers]
    assert [w["metrics"]["eval_every"] for w in written] == [c.metrics.eval_every for c in cfgs]
    peers = demo.peer_configs("swarm", _args(rounds=3, eval_every=1), real, tmp_path / "b")
    assert all(yaml.safe_load(p.config.read_text())["metrics"]["eval_every"] == 1 for p in peers)


def test_specialise_gives_each_peer_one_part_in_both_arms(tmp_path: Path) -> None:
    """--specialise: peer i samples part i of the arithmetic universe (its eval stays on all three), the same
    in the alone arm; without it the peers keep the full mix; peers of another task are one clear error."""
    from swarm_node.config import load_config
    from swarm_node.errors import UserFacingError

    templates = [PEERS / f"{n}.yaml" for n in demo.DEFAULT_PEERS]
    for arm in ("swarm", "alone"):
        peers = demo.peer_configs(arm, _args(specialise=True), templates, tmp_path / arm)
        tasks = [load_config(p.config).task for p in peers]
        assert [t.mix for t in tasks] == [{"add": 1}, {"sub": 1}, {"signed": 1}], arm
        assert all(t.eval_split == "union" for t in tasks)  # every peer scored on all three parts
    plain = demo.peer_configs("swarm", _args(), templates, tmp_path / "plain")
    assert all(load_config(p.config).task.mix is None for p in plain)
    demo._check_specialise(templates, None)  # arithmetic peers: fine
    with pytest.raises(UserFacingError, match="--specialise.*reasoning_gym"):
        demo._check_specialise([PEERS / "rg-tiny-s.yaml"], None)


def _resolved(templates: list[Path], **kw) -> argparse.Namespace:
    args = _args(**kw)
    demo.resolve_defaults(args, templates)
    return args


def test_the_default_demo_is_the_specialised_swarm_against_alone(tmp_path: Path) -> None:
    """No flags: the tiny peers specialise, each with its alone run first, scored on 1200 problems (400 a part);
    --no-specialise is the demo as it was (full task, swarm arm only, the configs' eval_n); other tasks' peers
    (reasoning-gym) and a real model's chat arithmetic keep their setting without an error; an explicit
    --specialise on another task than arithmetic is one."""
    from swarm_node.config import load_config
    from swarm_node.errors import UserFacingError

    tiny = [PEERS / f"{n}.yaml" for n in demo.DEFAULT_PEERS]
    args = _resolved(tiny)
    assert (args.specialise, args.compare_alone, args.eval_n, args.rounds) == (True, True, 1200, 60)
    cfgs = [load_config(p.config) for p in demo.peer_configs("alone", args, tiny, tmp_path / "d")]
    assert [c.task.mix for c in cfgs] == [{"add": 1}, {"sub": 1}, {"signed": 1}]
    assert all(c.task.eval_n == 1200 and c.task.eval_split == "union" for c in cfgs)

    old = _resolved(tiny, no_specialise=True)
    assert (old.specialise, old.compare_alone, old.eval_n) == (False, False, None)
    cfgs = [load_config(p.config) for p in demo.peer_configs("swarm", old, tiny, tmp_path / "o")]
    assert all(c.task.mix is None and c.task.eval_n == load_config(t).task.eval_n for c, t in zip(cfgs, tiny,
                                                                                                  strict=True))
    assert _resolved(tiny, no_specialise=True, compare_alone=True).compare_alone is True
    assert _resolved(tiny, eval_n=300).eval_n == 300

    for other in ([PEERS / "rg-tiny-s.yaml"], [PEERS / "smollm2-135m.yaml"]):
        args = _resolved(other)
        assert (args.specialise, args.compare_alone, args.eval_n) == (False, False, None), other
    with pytest.raises(UserFacingError, match="--specialise.*reasoning_gym"):
        _resolved([PEERS / "rg-tiny-s.yaml"], specialise=True)
    assert _resolved(tiny, task="gsm8k").specialise is False
