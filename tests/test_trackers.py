"""TensorBoard and W&B trackers get the same fields as metrics.jsonl, written by the real libraries and read back
offline (TensorBoard's EventAccumulator; W&B offline mode, its run file parsed with W&B's own protobuf schema);
and the learning-rate schedule with warm-up.
"""

from __future__ import annotations

import math
import struct
import time
from pathlib import Path

import pytest

from swarm_node.config import load_config
from swarm_node.node.metrics import MetricsWriter, read_metrics
from swarm_node.node.trackers import scalars
from swarm_node.training.lr_schedule import lr_factor

ROWS = [
    {"round": 0, "reward_mean": None, "loss": None, "eval_accuracy": 0.25, "local_groups": 0},
    {"round": 1, "reward_mean": 0.5, "loss": -0.125, "local_groups": 3, "stepped": True, "lr": 1e-4,
     "rejected": {"stale": 2}, "external_groups_by_peer": {"abcd:tiny-m": 4}, "params_digest": "ff00"},
    {"round": 2, "reward_mean": 0.75, "loss": float("nan"), "local_groups": 2, "stepped": False, "lr": 2e-4,
     "rejected": {}, "eval_accuracy": 0.5},
]


def expected_scalars(path: Path) -> dict[tuple[str, int], float]:
    """Every numeric field of every row, as read back from metrics.jsonl."""
    return {(k, r["round"]): v for r in read_metrics(path) for k, v in scalars(r).items()}


def test_scalars_keep_the_metrics_jsonl_names():
    s = scalars(ROWS[1])
    assert s == {"round": 1.0, "reward_mean": 0.5, "loss": -0.125, "local_groups": 3.0, "stepped": 1.0, "lr": 1e-4,
                 "rejected/stale": 2.0, "external_groups_by_peer/abcd:tiny-m": 4.0}


def test_tensorboard_event_file_holds_the_metrics_rows(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, ["metrics.report_to=[tensorboard]"])
    w = MetricsWriter.from_config(tmp_path, cfg, node_name="tiny-s")
    for row in ROWS:
        w.write(row)
    w.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    got = {(tag, ev.step): ev.value for tag in acc.Tags()["scalars"] for ev in acc.Scalars(tag)}
    want = expected_scalars(tmp_path / "metrics.jsonl")
    assert set(got) == set(want) and ("rejected/stale", 1) in got and ("loss", 2) not in got  # NaN is left out
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-6), key


def _sybil_rows(n_rows: int, peers_per_row: int) -> list[dict]:
    """Rows whose groups came from a new crowd of peers each round, with names such peers could choose."""
    weird = ["../../etc/x", "a/b/c", "evil\nname", "x" * 500, "emoji-\u2603", ""]
    return [{"round": r, "local_groups": 1,
             "external_groups_by_peer": {f"{r}-{i}-{weird[i % len(weird)]}": 1 for i in range(peers_per_row)}}
            for r in range(n_rows)]


def test_peer_chosen_names_are_sanitised_and_bounded_over_a_run():
    from swarm_node.node.trackers import MAX_NAME_CHARS, MAX_NAMES_PER_FIELD, SeriesNames

    names = SeriesNames()
    tags: set[str] = set()
    for row in _sybil_rows(20, 50):
        s = scalars(row, names)
        assert sum(v for k, v in s.items() if k.startswith("external_groups_by_peer/")) == 50  # nothing lost
        tags |= set(s)
    peer_tags = {t for t in tags if t.startswith("external_groups_by_peer/")}
    assert len(peer_tags) == MAX_NAMES_PER_FIELD + 1 and "external_groups_by_peer/other" in peer_tags
    for t in peer_tags:
        name = t.split("/", 1)[1]
        assert "/" not in name and "\n" not in name and len(name) <= MAX_NAME_CHARS
        assert all(c.isascii() and (c.isalnum() or c in "_.:-") for c in name), name


def test_tensorboard_gets_a_bounded_number_of_series_from_a_sybil_crowd(tmp_path):
    """The real writer: 1000 peer names over 20 rounds become 32 series and `other`, read back from the file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from swarm_node.node.trackers import MAX_NAMES_PER_FIELD

    cfg = load_config(None, ["metrics.report_to=[tensorboard]"])
    w = MetricsWriter.from_config(tmp_path, cfg, node_name="tiny-s")
    for row in _sybil_rows(20, 50):
        w.write(row)
    w.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    peer_tags = [t for t in acc.Tags()["scalars"] if t.startswith("external_groups_by_peer/")]
    assert len(peer_tags) == MAX_NAMES_PER_FIELD + 1
    assert sum(ev.value for t in peer_tags for ev in acc.Scalars(t)) == 20 * 50


def _wandb_records(run_file: Path) -> list:
    """Records of a W&B run file: LevelDB-log framing (7-byte header, 32 KiB blocks) around W&B's protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk of a record
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
            buf = b""
    return records


@pytest.mark.slow  # wandb runs its own service process
def test_wandb_offline_run_holds_the_metrics_rows(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(None, ["metrics.report_to=[wandb]", "metrics.wandb_project=test-project", "seed=7"])
    w = MetricsWriter.from_config(tmp_path, cfg, node_name="tiny-s")
    for row in ROWS:
        w.write(row)
    w.close()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    end = time.monotonic() + 30  # wandb's service process may still be flushing the file after finish()
    records = _wandb_records(run_file)
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < end:
        time.sleep(0.2)
        records = _wandb_records(run_file)
    got = {}
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            step = items["_step"]
            got.update({(k, step): v for k, v in items.items() if not k.startswith("_")})
    want = expected_scalars(tmp_path / "metrics.jsonl")
    assert set(got) == set(want)
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-6), key
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "tiny-s" and run.project == "test-project"
    assert run.run_id == (tmp_path / "wandb_run_id").read_text()  # a restart continues this run


def test_missing_tracker_library_is_named_before_anything_starts(monkeypatch):
    import importlib.util

    from swarm_node.errors import UserFacingError
    from swarm_node.node import trackers

    real = importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda n: None if n == "wandb" else real(n))
    with pytest.raises(UserFacingError, match=r"wandb package is not installed; pip install 'swarm-node\[trackers\]'"):
        trackers.check_installed(["tensorboard", "wandb"])


# ---- learning-rate schedule ---------------------------------------------------------------------------


def test_lr_schedules_with_warmup():
    assert [lr_factor("constant", s) for s in range(3)] == [1.0, 1.0, 1.0]
    assert [lr_factor("constant", s, warmup=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    lin = [lr_factor("linear", s, warmup=2, total=6) for s in range(6)]
    assert lin == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])  # last round still trains
    cos = [lr_factor("cosine", s, warmup=0, total=4) for s in range(4)]
    assert cos == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))])
    assert all(a > b for a, b in zip(cos, cos[1:], strict=False))
    with pytest.raises(ValueError, match="needs the total"):
        lr_factor("linear", 3)


@pytest.mark.slow
def test_grpo_node_follows_the_schedule_and_reports_it(presets_dir, tmp_path):
    """A real node: metrics.jsonl's `lr` follows warm-up then linear decay, and the optimizer used it."""
    import torch

    from swarm_node.grpo.round import GRPONode

    torch.set_num_threads(1)
    cfg = load_config(None, ["rounds=4", "training.lr=0.001", "training.lr_schedule=linear",
                             "training.warmup_rounds=2", "task.prompts_per_round=2", "generation.num_generations=2",
                             "task.eval_n=4", "metrics.eval_every=100", "metrics.report_to=[tensorboard]"])
    node = GRPONode(cfg, tmp_path)
    try:
        lrs = []
        for _ in range(4):
            row = node.run_round()
            node.metrics.write(row)
            lrs.append(row["lr"])
            assert node.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(row["lr"])
    finally:
        node.metrics.close()
    assert lrs == pytest.approx([0.0005, 0.001, 0.001, 0.0005])
    assert [r["lr"] for r in read_metrics(tmp_path / "metrics.jsonl")] == pytest.approx(lrs)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_dpo_node_follows_the_schedule_and_logs_to_tensorboard(tmp_path):
    """DPO mode shares training.lr_schedule: cosine after a 2-round warm-up, over its rounds 0..4."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from swarm_node.dpo.round import run_dpo_node
    from swarm_node.models.factory import Preset, build_model, build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=1e-3, lr_lora=1e-3)
    build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, 0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = load_config(None, ["mode=dpo", f"model.path={tmp_path / 'model'}", "rounds=5", "dpo.lr=0.004",
                             "dpo.pairs_per_user=16", "dpo.heldout_pairs=16", "training.lr_schedule=cosine",
                             "training.warmup_rounds=2", "metrics.report_to=[tensorboard]"])
    assert run_dpo_node(cfg, tmp_path / "state", log_level="warning") == 0
    lrs = [r["lr"] for r in read_metrics(tmp_path / "state" / "metrics.jsonl")]
    assert lrs == pytest.approx([0.004 * lr_factor("cosine", s, 2, 5) for s in range(5)])
    assert lrs[:3] == pytest.approx([0.002, 0.004, 0.004]) and lrs[4] < lrs[3] < lrs[2]
    acc = EventAccumulator(str(tmp_path / "state" / "tensorboard"))
    acc.Reload()
    assert [ev.step for ev in acc.Scalars("dpo_loss")] == [0, 1, 2, 3, 4]
    assert [ev.value for ev in acc.Scalars("lr")] == pytest.approx(lrs)
