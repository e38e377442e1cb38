"""metrics.jsonl rows are strict JSON and never silently dropped; the opt-in Prometheus endpoint is labelled by node."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request

import pytest

from swarm_node.errors import UserFacingError
from swarm_node.node.metrics import MetricsWriter, read_metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jsonl_rows_are_strict_json_and_truncate_on_resume(tmp_path):
    w = MetricsWriter(tmp_path)
    for r in range(4):
        w.write({"round": r, "loss": float("nan") if r == 1 else 0.5, "rejected": {"stale": r}})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["round"] for ln in lines] == [0, 1, 2, 3]
    assert json.loads(lines[1])["loss"] is None  # NaN written as null, never as a bare NaN token
    w.truncate_after(2)
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]


def test_restart_without_checkpoint_backs_up_and_logs_the_old_rows(tmp_path, caplog):
    w = MetricsWriter(tmp_path)
    for r in range(3):
        w.write({"round": r, "reward_mean": 0.1 * r})
    before = (tmp_path / "metrics.jsonl").read_text()
    with caplog.at_level(logging.WARNING, logger="swarm_node.node.metrics"):
        MetricsWriter(tmp_path).truncate_after(-1)  # what a restart with no readable checkpoint does
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    backups = list(tmp_path.glob("metrics.jsonl.*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == before  # nothing lost
    assert any("no checkpoint to resume from" in r.message and backups[0].name in r.message for r in caplog.records)
    # a resume that drops later rounds keeps a copy too; a second backup never overwrites the first
    w = MetricsWriter(tmp_path)
    for r in range(4):
        w.write({"round": r})
    with caplog.at_level(logging.WARNING, logger="swarm_node.node.metrics"):
        w.truncate_after(1)
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]
    assert len(list(tmp_path.glob("metrics.jsonl.*.bak"))) == 2
    assert any("dropped 2 metrics.jsonl rows" in r.message for r in caplog.records)
    caplog.clear()
    w.truncate_after(5)  # nothing to drop: no backup, no log line
    assert len(list(tmp_path.glob("metrics.jsonl.*.bak"))) == 2 and not caplog.records


def test_prometheus_labels_by_node_counts_with_counters_and_binds_loopback(tmp_path):
    port = free_port()
    w = MetricsWriter(tmp_path, prometheus_port=port, node_name="tiny-s")
    try:
        assert w._server.server_address[0] == "127.0.0.1"  # not every interface unless told so
        w.write({"round": 6, "reward_mean": 0.5, "local_groups": 2, "external_groups": 1,
                 "rejected": {"protocol:schema": 2}, "external_groups_by_peer": {"peer-chosen-name": 3}})
        w.write({"round": 7, "reward_mean": 0.25, "local_groups": 3, "external_groups": 0,
                 "rejected": {"protocol:schema": 1, "made-up-by-peer": 5, "logprob_skew": 1, "newcomer_capped": 4},
                 "stepped": True, "note": "x"})
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        w.close()
    assert 'swarm_node_round{node="tiny-s"} 7.0' in body  # gauges: the last value
    assert 'swarm_node_reward_mean{node="tiny-s"} 0.25' in body
    assert "# TYPE swarm_node_local_groups_total counter" in body  # counters: running totals
    assert 'swarm_node_local_groups_total{node="tiny-s"} 5.0' in body
    assert 'swarm_node_external_groups_total{node="tiny-s"} 1.0' in body
    assert 'swarm_node_rounds_total{node="tiny-s"} 2.0' in body
    assert 'swarm_node_rejected_total{node="tiny-s",reason="protocol:schema"} 3.0' in body
    assert 'swarm_node_rejected_total{node="tiny-s",reason="logprob_skew"} 1.0' in body  # the Sybil defences
    assert 'swarm_node_rejected_total{node="tiny-s",reason="newcomer_capped"} 4.0' in body
    assert "peer_chosen_name" not in body and "made-up-by-peer" not in body  # peers cannot add series
    assert "swarm_node_" in body and all('node="tiny-s"' in ln for ln in body.splitlines()
                                        if ln.startswith("swarm_node_") and not ln.startswith("swarm_node_info"))


def test_prometheus_port_in_use_is_a_user_facing_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(UserFacingError, match="cannot serve /metrics on 127.0.0.1"):
            MetricsWriter(tmp_path, prometheus_port=busy.getsockname()[1])
