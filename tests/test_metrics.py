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


def test_lines_that_are_json_but_not_rows_are_skipped_on_read_and_resume(tmp_path, caplog):
    """A hand-edited or damaged file may hold valid JSON that is not an object: skipped with a warning, and
    a resume still truncates the rows (it used to call .get on a list and crash the node's start)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 0}\n[1, 2]\n3\n"text"\nnull\n{"round": 1}\n{"round": 2}\n')
    with caplog.at_level(logging.WARNING, logger="swarm_node"):
        assert [r["round"] for r in read_metrics(path)] == [0, 1, 2]
    assert sum("not a JSON object" in r.getMessage() for r in caplog.records) == 4
    MetricsWriter(tmp_path).truncate_after(1)
    assert [r["round"] for r in read_metrics(path)] == [0, 1]


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
                 "stepped": True, "note": "x", "time_split_s": {"sample": 1.5, "train": 2.25}})
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
    assert 'swarm_node_round_phase_seconds{node="tiny-s",phase="train"} 2.25' in body  # the round's time split
    assert "peer_chosen_name" not in body and "made-up-by-peer" not in body  # peers cannot add series
    assert "swarm_node_" in body and all('node="tiny-s"' in ln for ln in body.splitlines()
                                        if ln.startswith("swarm_node_") and not ln.startswith("swarm_node_info"))


def test_prometheus_port_in_use_is_a_user_facing_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(UserFacingError, match="cannot serve /metrics on 127.0.0.1"):
            MetricsWriter(tmp_path, prometheus_port=busy.getsockname()[1])


def test_a_round_row_carries_its_time_split(tmp_path):
    """sample, score, exchange, train and eval seconds of a real round (random tiny model, no preset build):
    each phase that ran is positive, and together they fit inside the round. (The swarm's exchange is timed by
    the multi-process tests' rows.)"""
    import time

    from swarm_node.config import NodeConfig
    from swarm_node.grpo.round import GRPONode
    from swarm_node.models.factory import PRESETS, build_model, build_tokenizer
    from swarm_node.node.timing import PHASES

    tok = build_tokenizer()
    build_model(PRESETS["tiny-s"], len(tok), tok.pad_token_id, tok.eos_token_id, seed=0).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = NodeConfig.model_validate({"rounds": 1, "model": {"path": str(tmp_path / "m")},
                                     "task": {"prompts_per_round": 4, "eval_n": 8},
                                     "generation": {"num_generations": 4, "max_new_tokens": 4},
                                     "training": {"skip_zero_advantage_groups": False}})
    node = GRPONode(cfg, tmp_path / "state")
    t0 = time.perf_counter()
    row = node.run_round()
    wall = time.perf_counter() - t0
    split = row["time_split_s"]
    assert list(split) == list(PHASES)
    assert all(split[p] > 0 for p in ("sample", "score", "train", "eval")), split
    assert 0 <= split["exchange"] < 0.5, split  # no swarm: nothing to publish or take
    assert sum(split.values()) <= wall + 1e-3, (split, wall)
    assert split["train"] == pytest.approx(row["train_s"], abs=1e-3)


@pytest.mark.parametrize("resume_at", [3, 10])  # the checkpoint's round: at, and past, the last whole row
@pytest.mark.parametrize("tail", ['{"round": 4, "rewa', '{"round": 4}'])  # cut mid-row, or just before "\n"
def test_a_torn_last_line_is_cut_on_resume_so_the_next_row_stands_alone(tmp_path, resume_at, tail, caplog):
    """A crash mid-append leaves a last line without its newline. Resuming at or past the last whole row used
    to leave it, and the next row was glued onto it: both lost to every reader."""
    w = MetricsWriter(tmp_path)
    for r in range(4):
        w.write({"round": r})
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write(tail)
    before = path.read_text()
    with caplog.at_level(logging.WARNING, logger="swarm_node.node.metrics"):
        MetricsWriter(tmp_path).truncate_after(resume_at)
    kept_tail = tail.endswith("}") and resume_at >= 4  # a whole row that only lacked its newline stays
    MetricsWriter(tmp_path).write({"round": 5 if kept_tail else 4})
    text = path.read_text()
    assert text.endswith("\n") and [json.loads(ln)["round"] for ln in text.splitlines()] == \
        ([0, 1, 2, 3, 4, 5] if kept_tail else [0, 1, 2, 3, 4])
    backups = list(tmp_path.glob("metrics.jsonl.*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == before  # nothing lost
    dropped = tail.endswith("}") and resume_at < 4  # a whole row 4 past the checkpoint: dropped as before
    assert any(("dropped 1 metrics.jsonl rows" if dropped else "cut short") in r.getMessage() for r in caplog.records)


def _lines_are_whole(path) -> list[int]:
    """Rounds of the file's rows, after checking that every line is a whole JSON row (no torn line)."""
    text = path.read_text()
    assert not text or text.endswith("\n"), text[-200:]
    return [json.loads(ln)["round"] for ln in text.splitlines()]


@pytest.mark.parametrize("disk", ["tmpfs", "file_size_limit"])
def test_a_full_disk_costs_no_row_and_leaves_no_torn_line(tmp_path, disk, caplog):
    """metrics.jsonl on a disk that fills up (a real tmpfs, root only; or a file-size limit on this process:
    the kernel's EFBIG after a short write, any user). Writes never raise; a row that does not fit is cut
    back off and held; the warning is rate-limited and counts; once space returns the held rows land in order."""
    from tooling.full_disk import FileSizeLimit, tmpfs_or_skip

    pad = "x" * 3000  # a row fills most of a page: on a full tmpfs the next row cannot fit in the last one
    state = tmp_path / "disk"
    tmpfs = tmpfs_or_skip(state, "256k", "the file_size_limit case covers the same path") if disk == "tmpfs" else None
    try:
        w = MetricsWriter(state)
        for r in range(3):
            w.write({"round": r, "pad": pad})
        before = (state / "metrics.jsonl").read_bytes()
        limit = FileSizeLimit()
        with caplog.at_level(logging.WARNING, logger="swarm_node.node.metrics"):
            if tmpfs is not None:
                tmpfs.fill()
            else:
                limit.fill(len(before) + 1000)  # the next row gets 1000 of its ~3000 bytes in, then EFBIG
            try:
                for r in range(3, 10):
                    w.write({"round": r, "pad": pad})
                    assert _lines_are_whole(state / "metrics.jsonl")[:3] == [0, 1, 2]
            finally:
                tmpfs.free() if tmpfs is not None else limit.free()
            assert w.write_failures >= 6 and w.held_rows >= 6, (w.write_failures, w.held_rows)
            failed_lines = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
            assert 1 <= len(failed_lines) <= 3, failed_lines  # rate-limited: 3 lines, then one per 100 s
            assert "the node keeps training" in failed_lines[0]
            w.write({"round": 10, "pad": pad})
        assert w.held_rows == 0
        assert _lines_are_whole(state / "metrics.jsonl") == list(range(11))
        assert sum("writable again" in r.getMessage() for r in caplog.records) == 1
        w.close()
    finally:
        if tmpfs is not None:
            tmpfs.close()


def test_rows_held_beyond_the_bound_are_dropped_and_counted(tmp_path, monkeypatch):
    """Memory stays bounded however long the disk stays full: MAX_HELD_ROWS rows, the oldest dropped."""
    from swarm_node.node import metrics

    monkeypatch.setattr(metrics, "MAX_HELD_ROWS", 5)
    w = MetricsWriter(tmp_path)
    (tmp_path / "metrics.jsonl").mkdir()  # an append to a directory fails (EISDIR), like a full disk
    for r in range(8):
        w.write({"round": r})
    assert w.held_rows == 5 and w.rows_dropped == 3 and w.write_failures == 8
    (tmp_path / "metrics.jsonl").rmdir()
    w.write({"round": 8})
    assert _lines_are_whole(tmp_path / "metrics.jsonl") == [4, 5, 6, 7, 8] and w.rows_dropped == 4


def test_a_failing_tracker_never_stops_the_row(tmp_path):
    class Broken:
        def log(self, row, step):
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    w = MetricsWriter(tmp_path, trackers=[Broken()])
    w.write({"round": 0})
    w.write({"round": 1})
    assert w.tracker_failures == 2 and _lines_are_whole(tmp_path / "metrics.jsonl") == [0, 1]
