"""metrics.jsonl rows are strict JSON; the opt-in Prometheus endpoint exports the last round's numbers."""

from __future__ import annotations

import json
import socket
import urllib.request

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


def test_prometheus_endpoint_exports_round_values(tmp_path):
    port = free_port()
    w = MetricsWriter(tmp_path, prometheus_port=port)
    w.write({"round": 6, "reward_mean": 0.5, "rejected": {"protocol:schema": 2},
             "external_groups_by_peer": {"peer-chosen-name": 3}})
    w.write({"round": 7, "reward_mean": 0.25, "rejected": {"protocol:schema": 1, "made-up-by-peer": 5},
             "stepped": True, "note": "x"})
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "swarm_node_round 7.0" in body
    assert "swarm_node_reward_mean 0.25" in body
    assert "swarm_node_rejected_total_protocol_schema 3.0" in body  # running total, not the last round's
    assert "peer_chosen_name" not in body and "made_up_by_peer" not in body  # peers cannot add series
