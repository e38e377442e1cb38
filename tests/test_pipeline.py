"""`pipeline: true`: round r's own samples come from the policy before round r-1's step, and say so.

The real round loop on the warmed-up tiny-s preset, in-process. The weights before every optimizer step are
recorded; each round's local groups are then scored under each recorded policy, so the test sees which
weights actually sampled them (not just what the metrics row claims).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swarm_node.config import NodeConfig
from swarm_node.grpo.round import GRPONode

pytestmark = pytest.mark.slow

ROUNDS = 5


def _cfg(pipeline: bool) -> NodeConfig:
    return NodeConfig.model_validate({
        "seed": 3, "rounds": ROUNDS, "pipeline": pipeline,
        "model": {"path": "tiny-s"},
        "task": {"name": "arithmetic", "prompts_per_round": 16, "eval_n": 20},
        "generation": {"num_generations": 6, "max_new_tokens": 6},
        "training": {"lr": 3e-4},  # large steps, so one version's log-probs are far from the next one's
        "metrics": {"eval_every": 1000},
    })


def _run(tmp_path, pipeline: bool):
    """Run ROUNDS rounds; -> (metrics rows, weights before each round's step, local groups of each round)."""
    torch.manual_seed(0)
    node = GRPONode(_cfg(pipeline), tmp_path)
    before_step: dict[int, dict] = {}
    local_groups: dict[int, list] = {}
    real_step = node.trainer.step

    def recording_step(groups):
        r = node.last_round + 1
        before_step[r] = {k: v.detach().clone() for k, v in node.loaded.model.state_dict().items()}
        local_groups[r] = [g for g in groups if g.is_local]
        return real_step(groups)

    node.trainer.step = recording_step
    try:
        rows = [node.run_round() for _ in range(ROUNDS)]
    finally:
        node.close()
    return node, rows, before_step, local_groups


def _max_gap(node, weights: dict, groups: list) -> float:
    """Largest |behaviour log-prob - log-prob under `weights`| over the groups' completion tokens."""
    node.loaded.model.load_state_dict(weights)
    recomputed = node.trainer.completion_logprobs(groups)
    return max(float(np.max(np.abs(g.behaviour_logprobs[i] - lp[i]))) if lp[i].size else 0.0
               for g, lp in zip(groups, recomputed, strict=True) for i in range(g.size))


def test_pipelined_samples_come_from_the_previous_policy_and_are_marked_one_version_stale(presets_dir, tmp_path):
    node, rows, before_step, local = _run(tmp_path, pipeline=True)
    assert all(row["stepped"] for row in rows[:-1]), [row["stepped"] for row in rows]  # it trains
    assert rows[0]["policy_version"] == 0 and rows[0]["local_version_lag"] == 0  # nothing in flight yet
    for r in range(2, ROUNDS + 1):
        row = rows[r - 1]
        assert row["policy_version"] == r - 2 and row["local_version_lag"] == 1, row
        # behaviour log-probs of round r's own samples are those of the weights before round r-1's step
        # (policy version r-2), not of the weights that train on them (version r-1)
        sampled_by = _max_gap(node, before_step[r - 1], local[r])
        trained_by = _max_gap(node, before_step[r], local[r])
        assert sampled_by < 1e-3 < trained_by, (r, sampled_by, trained_by)
    # F-TIS sees them as off-policy: the local tokens' importance ratios are no longer exactly 1
    assert any(abs(row["mean_ratio_local"] - 1.0) > 1e-4 for row in rows[1:] if row.get("mean_ratio_local"))


def test_without_pipeline_own_samples_are_on_policy(presets_dir, tmp_path):
    node, rows, before_step, local = _run(tmp_path, pipeline=False)
    for r in range(1, ROUNDS + 1):
        assert rows[r - 1]["policy_version"] == r - 1 and rows[r - 1]["local_version_lag"] == 0
        assert _max_gap(node, before_step[r], local[r]) < 1e-3
