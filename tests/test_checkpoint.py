"""Checkpoints: replacing one is never destructive, crash leftovers are cleaned, junk is not a checkpoint."""

from __future__ import annotations

import torch

from swarm_node.node.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    remove_partial,
    save_checkpoint,
)


def test_resaving_a_round_replaces_it_whole(tmp_path):
    m = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, 5, m, {"optimizer": {}}, {}, "fp")
    with torch.no_grad():
        m.weight.add_(1.0)
    save_checkpoint(tmp_path, 5, m, {"optimizer": {}}, {}, "fp")
    assert [c.round for c in list_checkpoints(tmp_path)] == [5]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    fresh = torch.nn.Linear(3, 2)
    load_checkpoint(latest_checkpoint(tmp_path), fresh, "fp")
    assert torch.equal(fresh.weight, m.weight)


def test_keep_and_leftovers(tmp_path):
    m = torch.nn.Linear(3, 2)
    for r in (1, 2, 3):
        save_checkpoint(tmp_path, r, m, {}, {}, "fp", keep=2)
    assert [c.round for c in list_checkpoints(tmp_path)] == [2, 3]
    (tmp_path / ".tmp-ckpt-00000004-999").mkdir()
    (tmp_path / ".old-ckpt-00000003-999").mkdir()
    bad = tmp_path / "ckpt-00000009"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    assert [c.round for c in list_checkpoints(tmp_path)] == [2, 3]  # unreadable meta: not a checkpoint
    remove_partial(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
