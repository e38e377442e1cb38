"""Atomic checkpoints: trainable weights (full model or LoRA adapter), optimizer, round, RNG, config hash.

A checkpoint is a directory `ckpt-<round>` written under a temporary name and renamed into place, so a
crash mid-write never leaves a half checkpoint that a restart would pick up. Weights are a safetensors
file (`model.safetensors`: plain tensors, readable by any tool, never unpickled); optimizer state and RNG
stay `torch.save` files read with `weights_only=True`. Checkpoints written before safetensors
(`model.pt`) still load. `meta.json` records the base model and LoRA settings so `swarm-node export`
and `swarm-node eval` can rebuild the trained model from the state dir alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from swarm_node.errors import UserFacingError
from swarm_node.training.params import trainable_named

log = logging.getLogger(__name__)

PREFIX = "ckpt-"
WEIGHTS_FILE = "model.safetensors"
LEGACY_WEIGHTS_FILE = "model.pt"  # torch.save checkpoints written before safetensors


@dataclass
class Checkpoint:
    round: int
    path: Path
    meta: dict


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """Only what training changes: all weights for a full model, the adapter for LoRA."""
    return {n: p.detach().cpu().clone() for n, p in trainable_named(model)}


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (disk full, I/O error); nothing of it is left on disk, the previous one stands."""


def save_checkpoint(
    state_dir: Path,
    round_: int,
    model: Any,
    optimizer_state: dict,
    extra: dict,
    config_fp: str,
    keep: int = 2,
) -> Path:
    """Write `ckpt-<round>` atomically; raises CheckpointWriteError (after removing the partial copy) on failure.

    Every file goes to a temporary directory, is fsynced, and the directory is renamed into place, so a
    reader (`restore_newest`) sees either the whole new checkpoint or none of it. A write that fails half
    way (ENOSPC) removes its temporary directory at once: on a full disk it holds the space that the
    next attempt, or the rest of the node, needs.
    """
    state_dir = Path(state_dir)
    final = state_dir / f"{PREFIX}{round_:08d}"
    tmp = state_dir / f".tmp-{PREFIX}{round_:08d}-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _write_files(tmp, round_, model, optimizer_state, extra, config_fp)
    except Exception as exc:  # OSError, or the writers' own wrappers (safetensors, torch) of an I/O error
        free = _free_space(state_dir)  # before the cleanup frees it: torch's own message does not say "disk full"
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(f"writing checkpoint {final.name} failed: {_describe(exc)} ({free})") from exc
    old = None
    try:
        if final.exists():  # never delete the good copy before the new one is in place
            old = state_dir / f".old-{PREFIX}{round_:08d}-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync(state_dir)
    except OSError as exc:
        if old is not None and not final.exists():
            os.replace(old, final)  # put the previous copy back
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(f"moving checkpoint {final.name} into place failed: {_describe(exc)}") from exc
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in list_checkpoints(state_dir)[:-keep]:
        shutil.rmtree(stale.path, ignore_errors=True)
    return final


def _write_files(tmp: Path, round_: int, model: Any, optimizer_state: dict, extra: dict, config_fp: str) -> None:
    save_file(trainable_state(model), str(tmp / WEIGHTS_FILE))
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save({"torch_rng": torch.get_rng_state()}, tmp / "rng.pt")
    meta = {"round": round_, "config_fingerprint": config_fp, **extra}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))  # last: a checkpoint is listed by its meta.json
    for f in tmp.iterdir():  # everything on disk before the rename makes it visible
        _fsync(f)
    _fsync(tmp)


def _free_space(path: Path) -> str:
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "free space unknown"
    return f"disk full: {free >> 10} KiB free" if free < 2**20 else f"{free / 2**20:.0f} MiB free on that disk"


def _describe(exc: BaseException) -> str:
    """One line: the OS error if there is one in the chain (safetensors and torch wrap it), else the message."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return f"[Errno {seen.errno}] {os.strerror(seen.errno)}"
        seen = seen.__cause__ or seen.__context__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def failed_save_line(state_dir: Path, round_: int, exc: BaseException) -> str:
    """The one log line of a failed save: what failed, and which checkpoint a restart would resume from."""
    prev = latest_checkpoint(state_dir)
    kept = f"{prev.path.name} (round {prev.round}) is still the one to resume from" if prev else "no checkpoint on disk yet"
    return f"checkpoint of round {round_} not written: {exc}; {kept}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_partial(state_dir: Path) -> None:
    """Delete temporary directories that a crash mid-save left behind (each may hold a full model).

    A crash between the two renames of a re-save leaves the good copy as `.old-ckpt-<r>-<pid>` with no
    `ckpt-<r>`: that copy is put back rather than deleted.
    """
    for p in sorted(Path(state_dir).glob(f".old-{PREFIX}*")):
        final = p.parent / p.name.removeprefix(".old-").rsplit("-", 1)[0]
        if p.is_dir() and not final.exists() and (p / "meta.json").is_file():
            os.replace(p, final)
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
    restore_weights(ckpt, model)
    opt_state = torch.load(ckpt.path / "optimizer.pt", map_location="cpu", weights_only=True)
    rng = torch.load(ckpt.path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch_rng"])
    return opt_state, ckpt.meta



def restore_newest(state_dir: Path, model: Any, trainer: Any, config_fp: str) -> Checkpoint | None:
    """Restore the newest readable checkpoint into `model` and `trainer` (its `load_state_dict`), after
    removing crash leftovers. An unreadable checkpoint (a file cut short by a crash or power loss) falls
    back to the one before; a checkpoint of another configuration is refused. None: nothing to resume.
    """
    remove_partial(state_dir)
    for ck in reversed(list_checkpoints(state_dir)):
        try:
            state, _meta = load_checkpoint(ck, model, config_fp)
            trainer.load_state_dict(state)
        except UserFacingError:
            raise
        except Exception as exc:
            log.warning("checkpoint %s is unreadable (%s); trying the one before", ck.path, exc)
            continue
        return ck
    return None

def load_weights(ckpt_path: Path) -> dict[str, torch.Tensor]:
    """The trainable tensors of a checkpoint directory (safetensors, or a legacy `model.pt`)."""
    path = Path(ckpt_path)
    if (path / WEIGHTS_FILE).is_file():
        return load_file(str(path / WEIGHTS_FILE), device="cpu")
    if (path / LEGACY_WEIGHTS_FILE).is_file():
        return torch.load(path / LEGACY_WEIGHTS_FILE, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path} has neither {WEIGHTS_FILE} nor {LEGACY_WEIGHTS_FILE}")


def restore_weights(ckpt: Checkpoint, model: Any) -> None:
    """Copy a checkpoint's tensors into `model` in place (names must be the model's trainable ones)."""
    weights = load_weights(ckpt.path)
    params = dict(model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise UserFacingError(f"checkpoint {ckpt.path} does not match the model (unknown tensors: {missing[:3]})")
    with torch.no_grad():
        for n, t in weights.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))


# --- the trained model of a state dir (export, eval) -------------------------------------------------
def model_record(loaded: Any, lora: Any | None) -> dict:
    """What meta.json must hold to rebuild the trained model without the node's config.

    `model_path` is the directory the weights were loaded from (absolute), `model_source` what the config
    named (a preset name is rebuilt on a machine that lacks the directory), `lora` the adapter settings.
    """
    path = Path(loaded.path)
    return {
        "model_name": loaded.name,
        "is_lora": bool(loaded.is_lora),
        "model_path": str(path.resolve()) if path.is_dir() else loaded.path,
        "model_source": loaded.meta.get("preset") or loaded.path,
        "model_sha256": loaded.meta.get("sha256"),
        "lora": lora.model_dump() if loaded.is_lora and lora is not None else None,
    }


def is_state_dir(path: Path) -> bool:
    """A node's --state-dir: it holds ckpt-* directories (or at least the metrics of a run)."""
    p = Path(path)
    return p.is_dir() and (any(p.glob(f"{PREFIX}*")) or (p / "metrics.jsonl").is_file())


def load_trained_model(state_dir: Path, *, dtype: str = "auto", device: str = "auto") -> tuple[Any, Checkpoint]:
    """The base model of a state dir with the weights of its newest readable checkpoint restored.

    Unreadable checkpoints (a write cut short) fall back to the one before, as a resuming node does.
    Raises UserFacingError when the state dir has no usable checkpoint or does not say its base model.
    """
    from swarm_node.config import LoraConfig
    from swarm_node.models.loading import load_model

    state_dir = Path(state_dir)
    cks = list_checkpoints(state_dir)
    if not cks:
        raise UserFacingError(f"{state_dir} has no checkpoint (ckpt-*/meta.json); has the node finished a round?")
    errors = []
    for ck in reversed(cks):
        source = ck.meta.get("model_path")
        if not source:
            raise UserFacingError(
                f"checkpoint {ck.path} does not record its base model (written by an older swarm-node); "
                "resume it once with the current version, or load its weights by hand"
            )
        if not Path(source).is_dir():  # another machine: rebuild a preset by name
            source = ck.meta.get("model_source") or source
        lora = LoraConfig(**ck.meta["lora"]) if ck.meta.get("lora") else None
        loaded = load_model(source, dtype=dtype, device=device, lora=lora, name=ck.meta.get("model_name"))
        want = ck.meta.get("model_sha256")
        if want and loaded.meta.get("sha256") and loaded.meta["sha256"] != want:
            raise UserFacingError(
                f"checkpoint {ck.path} was trained from base weights {want[:12]} but {source} now holds "
                f"{loaded.meta['sha256'][:12]} (a rebuilt preset of another version?)"
            )
        try:
            restore_weights(ck, loaded.model)
        except UserFacingError:
            raise
        except Exception as exc:  # a truncated weights file
            errors.append(f"{ck.path.name}: {exc.__class__.__name__}")
            continue
        loaded.model.eval()
        return loaded, ck
    raise UserFacingError(f"{state_dir}: no readable checkpoint ({'; '.join(errors)})")
