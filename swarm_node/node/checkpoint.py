"""Atomic checkpoints: trainable weights (full model or LoRA adapter), optimizer, round, RNG, config hash.

A checkpoint is a directory `ckpt-<round>` written under a temporary name and renamed into place, so a
crash mid-write never leaves a half checkpoint that a restart would pick up.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarm_node.errors import UserFacingError
from swarm_node.training.params import trainable_named

PREFIX = "ckpt-"


@dataclass
class Checkpoint:
    round: int
    path: Path
    meta: dict


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """Only what training changes: all weights for a full model, the adapter for LoRA."""
    return {n: p.detach().cpu().clone() for n, p in trainable_named(model)}


def save_checkpoint(
    state_dir: Path,
    round_: int,
    model: Any,
    optimizer_state: dict,
    extra: dict,
    config_fp: str,
    keep: int = 2,
) -> Path:
    state_dir = Path(state_dir)
    final = state_dir / f"{PREFIX}{round_:08d}"
    tmp = state_dir / f".tmp-{PREFIX}{round_:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(trainable_state(model), tmp / "model.pt")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save({"torch_rng": torch.get_rng_state()}, tmp / "rng.pt")
    meta = {"round": round_, "config_fingerprint": config_fp, **extra}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    for f in tmp.iterdir():  # everything on disk before the rename makes it visible
        _fsync(f)
    _fsync(tmp)
    old = None
    if final.exists():  # never delete the good copy before the new one is in place
        old = state_dir / f".old-{PREFIX}{round_:08d}-{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(state_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in list_checkpoints(state_dir)[:-keep]:
        shutil.rmtree(stale.path, ignore_errors=True)
    return final


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_partial(state_dir: Path) -> None:
    """Delete temporary directories that a crash mid-save left behind (each may hold a full model)."""
    for p in Path(state_dir).glob(f".*-{PREFIX}*"):
        if p.is_dir() and (p.name.startswith(".tmp-") or p.name.startswith(".old-")):
            shutil.rmtree(p, ignore_errors=True)


def list_checkpoints(state_dir: Path) -> list[Checkpoint]:
    out = []
    for p in Path(state_dir).glob(f"{PREFIX}*"):
        meta_file = p / "meta.json"
        if p.is_dir() and meta_file.is_file():
            try:
                meta = json.loads(meta_file.read_text())
                out.append(Checkpoint(round=int(meta["round"]), path=p, meta=meta))
            except (ValueError, KeyError, TypeError, OSError):
                continue  # unreadable: not a checkpoint we can resume from
    return sorted(out, key=lambda c: c.round)


def latest_checkpoint(state_dir: Path) -> Checkpoint | None:
    cks = list_checkpoints(state_dir)
    return cks[-1] if cks else None


def load_checkpoint(ckpt: Checkpoint, model: Any, config_fp: str) -> tuple[dict, dict]:
    """Restore weights and torch RNG in place; return (optimizer state, meta)."""
    if ckpt.meta.get("config_fingerprint") != config_fp:
        raise UserFacingError(
            f"checkpoint {ckpt.path} was written with another model/task configuration "
            f"(fingerprint {ckpt.meta.get('config_fingerprint')} != {config_fp}); "
            "use a new --state-dir or the original config"
        )
    weights = torch.load(ckpt.path / "model.pt", map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise UserFacingError(f"checkpoint {ckpt.path} does not match the model (unknown tensors: {missing[:3]})")
    with torch.no_grad():
        for n, t in weights.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))
    opt_state = torch.load(ckpt.path / "optimizer.pt", map_location="cpu", weights_only=True)
    rng = torch.load(ckpt.path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch_rng"])
    return opt_state, ckpt.meta
