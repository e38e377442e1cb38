"""The single-node loop learns, resumes exactly, and survives off-policy samples from another model.

These run the real round loop (`GRPONode`) on the warmed-up tiny presets, in-process, with fixed seeds.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from swarm_node.config import NodeConfig
from swarm_node.grpo.round import GRPONode, run_grpo_node
from swarm_node.node.checkpoint import WEIGHTS_FILE, latest_checkpoint, load_weights

pytestmark = pytest.mark.slow


def make_cfg(model: str, **over) -> NodeConfig:
    data = {
        "seed": 1,
        "model": {"path": model},
        "task": {"name": "arithmetic", "prompts_per_round": 32, "eval_n": 400},
        "generation": {"num_generations": 8, "max_new_tokens": 6},
        "training": {"variant": "on_policy"},
        "metrics": {"eval_every": 1000},
        "checkpoint": {"every_rounds": 1000},
    }
    for dotted, value in over.items():
        node = data
        *head, last = dotted.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = value
    return NodeConfig.model_validate(data)


LEARN_ROUNDS = 80


def test_tiny_s_alone_raises_heldout_accuracy(presets_dir, tmp_path):
    torch.manual_seed(0)
    # scored on the whole held-out id split (2000 problems): at n=400 one run's paired SE (~2.4 points) is
    # about the size of the gain, at n=2000 it is ~1.05
    node = GRPONode(make_cfg("tiny-s", **{"task.eval_n": 2000}), tmp_path)
    before = node.evaluate()["accuracy"]
    for _ in range(LEARN_ROUNDS):
        node.run_round()
    after = node.evaluate()["accuracy"]
    print(f"tiny-s alone: held-out id accuracy {before:.3f} -> {after:.3f} in {LEARN_ROUNDS} rounds")
    # The presets are built on the machine that runs the tests, so where they start and how fast they learn
    # depend on its CPU's numerics (version 4 presets, n=2000, paired SE ~0.0105, 2026-12-02):
    # - AVX-512/AMX Xeon, 40 rounds: 0.2945 -> 0.336 (+0.0415) for this seed (1); seeds 2, 3 +0.0595, +0.0465;
    # - AMD EPYC, idle: 0.257 -> +0.014 at 40 rounds (seeds 2-4: +0.028, +0.028, +0.038), +0.046 at 80
    #   (seeds 2-4: +0.0385, +0.0455, +0.045), ~4 s more.
    # So 80 rounds; the margin is 3 paired SEs at n=2000.
    assert after >= before + 0.03, (before, after)


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("lora", [False, True])
def test_stop_and_resume_continues_exactly(presets_dir, tmp_path, lora):
    cfg = make_cfg("tiny-s", rounds=3, **{"checkpoint.every_rounds": 2, "model.lora.enabled": lora,
                                          "task.eval_n": 20, "metrics.eval_every": 2})
    assert run_grpo_node(cfg, tmp_path) == 0
    ck = latest_checkpoint(tmp_path)
    assert ck is not None and ck.round == 3  # the final checkpoint on stop
    saved = load_weights(ck.path)
    saved_opt = torch.load(ck.path / "optimizer.pt", weights_only=True)

    node = GRPONode(cfg.model_copy(update={"rounds": 5}), tmp_path)
    node.resume()
    assert node.last_round == 3
    now = _params(node.loaded.model)
    assert set(now) == set(saved)
    for n, t in saved.items():
        assert torch.equal(now[n], t), n
    opt_now = node.trainer.state_dict()["optimizer"]["state"]
    assert opt_now.keys() == saved_opt["optimizer"]["state"].keys()
    for k, st in saved_opt["optimizer"]["state"].items():
        for name, v in st.items():
            assert torch.equal(torch.as_tensor(opt_now[k][name]), torch.as_tensor(v)), (k, name)

    # and the daemon entry point continues the counter from there
    assert run_grpo_node(cfg.model_copy(update={"rounds": 5}), tmp_path) == 0
    rounds = [json.loads(ln)["round"] for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3, 4, 5]


def test_unreadable_newest_checkpoint_falls_back(presets_dir, tmp_path):
    cfg = make_cfg("tiny-s", rounds=2, **{"checkpoint.every_rounds": 1, "task.eval_n": 20,
                                          "task.prompts_per_round": 4})
    assert run_grpo_node(cfg, tmp_path) == 0
    first = load_weights(tmp_path / "ckpt-00000001")
    (tmp_path / "ckpt-00000002" / WEIGHTS_FILE).write_bytes(b"truncated by a power cut")
    node = GRPONode(cfg, tmp_path)
    node.resume()
    assert node.last_round == 1
    now = _params(node.loaded.model)
    assert all(torch.equal(now[n], t) for n, t in first.items())
    rounds = [json.loads(ln)["round"] for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1]


def test_offpolicy_groups_from_tiny_m_with_ftis(presets_dir, tmp_path):
    """tiny-m's samples fed to a tiny-s learner: F-TIS keeps it finite and filters far-off negatives."""
    torch.manual_seed(0)
    source = GRPONode(make_cfg("tiny-m", seed=7), tmp_path / "m")
    learner = GRPONode(make_cfg("tiny-s", **{"training.variant": "ftis"}), tmp_path / "s")
    learner.external_source = lambda r: source.generate(r).train_groups(source="tiny-m")
    before = learner.evaluate()["accuracy"]
    rows = [learner.run_round() for _ in range(20)]
    after = learner.evaluate()["accuracy"]
    for p in learner.loaded.model.parameters():
        assert torch.isfinite(p).all()
    filtered_ext = sum(r["filtered_external"] for r in rows)
    ext = sum(r["external_groups"] for r in rows)
    print(f"ftis with tiny-m samples: accuracy {before:.3f} -> {after:.3f}, external groups {ext}, "
          f"filtered external sequences {filtered_ext}")
    assert ext > 0
    assert filtered_ext > 0, "far-off-policy negative samples should be filtered"
    assert after >= before - 0.03, (before, after)
    div = [r["divergence_external"] for r in rows if r["divergence_external"] is not None]
    assert div and all(math.isfinite(d) for d in div) and np.mean(div) > 0
