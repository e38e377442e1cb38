"""Checkpoints: replacing one is never destructive, crash leftovers are cleaned, junk is not a checkpoint."""

from __future__ import annotations

import pytest
import torch

from swarm_node.node.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    remove_partial,
    save_checkpoint,
)
from tooling.full_disk import mount_tmpfs


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


def _tensor_of(ckpt_dir) -> torch.Tensor:
    from swarm_node.node.checkpoint import load_weights

    return load_weights(ckpt_dir)["weight"]


def test_a_save_that_fails_half_way_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    """Disk full in the middle of a write: the error is one CheckpointWriteError, nothing half-written remains,
    and restore_newest resumes from the previous checkpoint."""
    import errno

    from swarm_node.node import checkpoint as ck

    m = torch.nn.Linear(64, 64)
    ck.save_checkpoint(tmp_path, 1, m, {"state": {}}, {}, "fp")
    good = m.weight.detach().clone()
    real_save = torch.save

    def disk_fills_up(obj, f, *a, **kw):  # writes part of the file, then the disk is full
        with open(f, "wb") as fh:
            fh.write(b"\x00" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", disk_fills_up)
    with torch.no_grad():
        m.weight.add_(1.0)
    with pytest.raises(ck.CheckpointWriteError, match=r"Errno 28"):
        ck.save_checkpoint(tmp_path, 2, m, {"state": {}}, {}, "fp")
    monkeypatch.setattr(ck.torch, "save", real_save)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000001"]  # no .tmp- left holding the space
    line = ck.failed_save_line(tmp_path, 2, OSError(errno.ENOSPC, "No space left on device"))
    assert "ckpt-00000001 (round 1) is still the one to resume from" in line and "\n" not in line

    class Trainer:
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            self.state = state

    fresh = torch.nn.Linear(64, 64)
    got = ck.restore_newest(tmp_path, fresh, Trainer(), "fp")
    assert got is not None and got.round == 1 and torch.equal(fresh.weight, good)


def test_a_resave_whose_rename_fails_puts_the_previous_copy_back(tmp_path, monkeypatch):
    from swarm_node.node import checkpoint as ck

    m = torch.nn.Linear(3, 2)
    ck.save_checkpoint(tmp_path, 5, m, {}, {}, "fp")
    before = _tensor_of(tmp_path / "ckpt-00000005")
    real_replace = ck.os.replace

    def failing_replace(src, dst):
        if str(src).endswith(f"-{ck.os.getpid()}") and ".tmp-" in str(src):
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(ck.os, "replace", failing_replace)
    with torch.no_grad():
        m.weight.add_(1.0)
    with pytest.raises(ck.CheckpointWriteError):
        ck.save_checkpoint(tmp_path, 5, m, {}, {}, "fp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000005"]
    assert torch.equal(_tensor_of(tmp_path / "ckpt-00000005"), before)


def test_a_crash_between_the_renames_of_a_resave_keeps_the_good_copy(tmp_path):
    """A crash after `ckpt-5 -> .old-ckpt-5-PID` and before `.tmp -> ckpt-5`: the next start puts .old back."""
    m = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, 5, m, {}, {}, "fp")
    (tmp_path / "ckpt-00000005").rename(tmp_path / ".old-ckpt-00000005-4242")
    (tmp_path / ".tmp-ckpt-00000005-4242").mkdir()  # the unfinished new copy
    remove_partial(tmp_path)
    assert [c.round for c in list_checkpoints(tmp_path)] == [5]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_real_enospc_on_a_tiny_filesystem(tmp_path):
    """The same on a real full disk (a 600 KiB tmpfs, needs root: skipped otherwise): the first checkpoint fits,
    the second fails half way in the weights writer with the kernel's ENOSPC."""
    import subprocess

    from swarm_node.node import checkpoint as ck

    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "600k"):
        pytest.skip("cannot mount a tmpfs (not root)")
    try:
        m = torch.nn.Linear(384, 384)  # ~580 KiB of float32 weights + bias
        small = torch.nn.Linear(256, 256)  # ~260 KiB
        ck.save_checkpoint(disk, 1, small, {}, {}, "fp")
        with pytest.raises(ck.CheckpointWriteError) as err:
            ck.save_checkpoint(disk, 2, m, {}, {}, "fp")
        assert "No space left on device" in str(err.value) or "Errno 28" in str(err.value), err.value
        assert sorted(p.name for p in disk.iterdir()) == ["ckpt-00000001"]
        fresh = torch.nn.Linear(256, 256)
        ck.load_checkpoint(ck.latest_checkpoint(disk), fresh, "fp")
        assert torch.equal(fresh.weight, small.weight)
        ck.save_checkpoint(disk, 3, small, {}, {}, "fp", keep=2)  # space came back: saving works again
        assert [c.round for c in ck.list_checkpoints(disk)] == [1, 3]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=10)


# ---- unreadable checkpoints: set aside, never outranking or outliving later rounds ---------------------

def corrupt(ckpt_dir, kind: str) -> None:
    """Make one file of a checkpoint unreadable the way a crash, a power loss or a bad disk does."""
    def tear(name: str) -> None:
        f = ckpt_dir / name
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    if kind == "torn_optimizer":
        tear("optimizer.pt")
    elif kind == "torn_weights":
        tear("model.safetensors")
    elif kind == "torn_rng":
        tear("rng.pt")
    elif kind == "missing_weights":
        (ckpt_dir / "model.safetensors").unlink()
    elif kind == "missing_meta":
        (ckpt_dir / "meta.json").unlink()
    elif kind == "garbled_meta":
        tear("meta.json")
    elif kind == "meta_of_another_round":
        import json

        meta = json.loads((ckpt_dir / "meta.json").read_text())
        (ckpt_dir / "meta.json").write_text(json.dumps({**meta, "round": meta["round"] + 100}))
    else:
        raise ValueError(kind)


CORRUPTIONS = ["torn_optimizer", "torn_weights", "torn_rng", "missing_weights", "missing_meta", "garbled_meta",
               "meta_of_another_round"]


class AdamTrainer:
    """A real torch optimizer behind the trainer interface the loop uses (state_dict / load_state_dict)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        self.steps_done = 0

    def step(self, model: torch.nn.Module) -> None:
        model(torch.ones(1, model.in_features)).sum().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps_done += 1

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps_done": self.steps_done}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_done = int(state["steps_done"])


def _trained_checkpoints(state_dir, rounds) -> dict[int, torch.Tensor]:
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    tr = AdamTrainer(m)
    weights = {}
    for r in rounds:
        tr.step(m)
        save_checkpoint(state_dir, r, m, tr.state_dict(), {}, "fp", keep=10)
        weights[r] = m.weight.detach().clone()
    return weights


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_an_unreadable_newest_checkpoint_is_set_aside_and_changes_nothing(tmp_path, kind, caplog):
    """The newest of two checkpoints is unreadable: restore_newest sets it aside as .unreadable with one
    warning naming the file, and restores the one before, whole (weights, optimizer, steps)."""
    from swarm_node.node.checkpoint import restore_newest

    weights = _trained_checkpoints(tmp_path, [1, 2])
    corrupt(tmp_path / "ckpt-00000002", kind)
    torch.manual_seed(1)
    fresh = torch.nn.Linear(4, 3)
    tr = AdamTrainer(fresh)
    with caplog.at_level("WARNING", logger="swarm_node.node.checkpoint"):
        got = restore_newest(tmp_path, fresh, tr, "fp")
    assert got is not None and got.round == 1
    assert torch.equal(fresh.weight, weights[1]) and tr.steps_done == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000001", "ckpt-00000002.unreadable"]
    lines = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(lines) == 1 and "set aside as ckpt-00000002.unreadable" in lines[0], lines
    assert [c.round for c in list_checkpoints(tmp_path)] == [1]  # the set-aside copy is no checkpoint


@pytest.mark.parametrize("kind", ["torn_optimizer", "torn_rng", "optimizer_of_another_model"])
def test_an_unreadable_only_checkpoint_leaves_the_model_and_trainer_as_loaded(tmp_path, kind):
    """Nothing readable (keep 1, or a first checkpoint): None, and neither the weights nor the optimizer of the
    bad checkpoint are left behind in the model (the run starts at round 0 from the model as loaded)."""
    from swarm_node.node.checkpoint import restore_newest

    weights = _trained_checkpoints(tmp_path, [3])
    if kind == "optimizer_of_another_model":  # reads, but the trainer cannot take it after half of it is applied
        bad = {"optimizer": AdamTrainer(torch.nn.Linear(4, 3)).state_dict()["optimizer"], "steps_done": "x"}
        torch.save(bad, tmp_path / "ckpt-00000003" / "optimizer.pt")
    else:
        corrupt(tmp_path / "ckpt-00000003", kind)
    torch.manual_seed(1)
    fresh = torch.nn.Linear(4, 3)
    as_loaded = fresh.weight.detach().clone()
    tr = AdamTrainer(fresh)
    assert restore_newest(tmp_path, fresh, tr, "fp") is None
    assert torch.equal(fresh.weight, as_loaded) and not torch.equal(fresh.weight, weights[3])
    assert tr.steps_done == 0 and not tr.optimizer.state_dict()["state"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-00000003.unreadable"]


@pytest.mark.parametrize("keep", [1, 2])
def test_a_save_never_prunes_the_checkpoint_it_has_just_written(tmp_path, keep):
    """An older run's checkpoint of a higher round (one that could not even be set aside) does not outrank
    the rounds trained now: each save keeps what it wrote, prunes that one first, and keeps `keep` in all."""
    m = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, 9, m, {}, {}, "fp", keep=keep)
    for r in (1, 2, 3):
        save_checkpoint(tmp_path, r, m, {}, {}, "fp", keep=keep)
        assert r in [c.round for c in list_checkpoints(tmp_path)]
    assert [c.round for c in list_checkpoints(tmp_path)] == ([3] if keep == 1 else [2, 3])
