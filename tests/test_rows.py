"""The typed metrics rows (node/rows.py) write the keys earlier versions wrote, so reports of old runs still read."""

from __future__ import annotations

import math

from swarm_node.node.metrics import MetricsWriter, read_metrics
from swarm_node.node.rows import DPORow, GRPORow, SwarmCosts

# the keys of the dict rows written before the rows were typed (2026-12-01)
GRPO_ROUND0 = {"round", "reward_mean", "loss", "local_groups", "external_groups", "filtered", "tokens_per_s",
               "gen_s", "train_s", "eval_accuracy", "eval_n", "model", "task_id", "time"}
GRPO_TRAINED = {"round", "reward_mean", "loss", "local_groups", "external_groups", "filtered", "filtered_external",
                "kept", "zero_advantage_groups", "mean_ratio_local", "mean_ratio_external", "truncated_frac_external",
                "divergence_external", "grad_norm", "lr", "stepped", "tokens_per_s", "gen_s", "gen_wait_s",
                "policy_version", "local_version_lag", "train_s", "collect_s", "external_groups_by_peer", "rejected",
                "rewards_overridden", "checkpoint_failures", "bytes_out", "bytes_in", "time", "eval_accuracy"}
GRPO_SWARM = {"bytes_per_token", "payload_bytes_out", "control_bytes_in", "control_bytes_out", "batch_age_s_mean",
              "batch_age_s_max", "version_lag_mean", "version_lag_max", "buffer_evicted", "buffer_superseded",
              "declined"}
DPO = {"round", "dpo_loss", "lr", "train_pref_acc", "heldout_pref_acc", "heldout_dpo_loss", "consensus_distance",
       "bytes_sent", "bytes_received", "payload_bytes", "params_digest", "params_probe", "graph", "spectral_gap",
       "num_peers", "neighbours", "missing_neighbours", "weights", "clipped", "clip_radius", "pull_ratio", "routed_around", "rejected",
       "checkpoint_failures", "user",
       "peer_id", "seconds"}


def test_grpo_rows_keep_their_keys() -> None:
    row0 = GRPORow.initial({"eval_accuracy": 0.25, "eval_n": 400}, {"name": "tiny-s"}, "arith")
    assert GRPO_ROUND0 <= set(row0.to_json())  # round 0 is now a whole row (its counts 0, the rest null)
    assert row0["local_groups"] == 0 and row0["loss"] is None and row0["model"] == {"name": "tiny-s"}

    alone = GRPORow(round=3, reward_mean=0.5, loss=0.1, stepped=True, rejected={"share_capped": 2})
    assert set(alone.to_json()) == GRPO_TRAINED  # no model, eval_n or swarm keys when there is none
    assert "model" not in alone and alone.get("eval_n") is None and alone["rejected"] == {"share_capped": 2}

    costs = SwarmCosts.of([1.0, 2.5], [0, 2], {"evicted": 1}, payload_bytes_out=10, control_bytes_in=3,
                          control_bytes_out=4)
    swarm = GRPORow(round=4, bytes_per_token=1.2, swarm=costs, eval_accuracy=0.3, eval_n=50)
    assert set(swarm.to_json()) == GRPO_TRAINED | GRPO_SWARM | {"eval_n"}
    assert swarm["batch_age_s_mean"] == 1.75 and swarm["version_lag_max"] == 2 and swarm["buffer_evicted"] == 1
    quiet = GRPORow(round=5, swarm=SwarmCosts.of([], [], {}, 0, 0, 0))  # a swarm round that took nothing
    assert quiet["batch_age_s_mean"] is None and "batch_age_s_mean" in quiet


def test_dpo_rows_keep_their_keys() -> None:
    first = DPORow(round=0, dpo_loss=0.7, lr=1e-3, train_pref_acc=0.5, model={"name": "m"})
    later = DPORow(round=1, dpo_loss=0.6, lr=1e-3, train_pref_acc=0.6)
    assert set(first.to_json()) == DPO | {"model"} and set(later.to_json()) == DPO


def test_a_row_is_written_as_strict_json(tmp_path) -> None:
    w = MetricsWriter(tmp_path)
    w.write(GRPORow(round=1, mean_ratio_external=math.nan, rejected={"task_mismatch": 1}))
    w.write({"round": 2, "loss": 0.5})  # plain dict rows (tests, tools) still work
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["mean_ratio_external"] is None and rows[0]["rejected"] == {"task_mismatch": 1}
    assert set(rows[0]) == GRPO_TRAINED and rows[1] == {"round": 2, "loss": 0.5}
