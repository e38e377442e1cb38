"""Atomic checkpoints: trainable weights (full model or LoRA adapter), optimizer, round, RNG, config hash.

A checkpoint is a directory `ckpt-<round>` written under a temporary name and renamed into place, so a
crash mid-write never leaves a half checkpoint that a restart would pick up. Weights are a safetensors
file (`model.safetensors`: plain tensors, readable by any tool, never unpickled); optimizer state and RNG
stay `torch.save` files read with `weights_only=True`. Checkpoints written before safetensors
(`model.pt`) still load. `meta.json` records the base model and LoRA settings so `swarm-node export`
and `swarm-node eval` can rebuild the trained model from the state dir alone.

What is never lost: a save never prunes the checkpoint it has just written (the model this process
trains), and a restart that finds a checkpoint it cannot read sets it aside as `ckpt-<round>.unreadable`
(one log line) and resumes from the one before, so the bad one neither outranks nor outlives the rounds
trained after it.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
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
UNREADABLE = ".unreadable"  # suffix of a checkpoint set aside at start because it could not be read
_NAME = re.compile(rf"{PREFIX}(\d+)")


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
    for stale in prunable(state_dir, final, keep):
        shutil.rmtree(stale.path, ignore_errors=True)
    return final


def prunable(state_dir: Path, newest: Path, keep: int) -> list[Checkpoint]:
    """The checkpoints a save that has just written `newest` may delete, with `keep` kept in all.

    `newest` is never one of them: it holds the model this process trains, so it is the last good
    checkpoint, whatever else lies in the state dir. Of the others, the keep-1 highest rounds below it stay;
    one of a higher round (a run this process did not continue: it could not be read at start) goes first.
    Sorting all of them by round and keeping the last `keep` deleted the checkpoint just written whenever
    such a one was there.
    """
    name = Path(newest).name
    round_ = int(_NAME.fullmatch(name).group(1))
    others = sorted((c for c in list_checkpoints(state_dir) if c.path.name != name),
                    key=lambda c: (c.round < round_, c.round))
    return others[: max(0, len(others) - (keep - 1))]


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


def _checkpoint_dirs(state_dir: Path) -> list[tuple[int, Path]]:
    """(round from the name, path) of every `ckpt-<round>` directory, oldest first; a set-aside
    `ckpt-<round>.unreadable` or any other name is not one."""
    out = []
    for p in Path(state_dir).glob(f"{PREFIX}*"):
        m = _NAME.fullmatch(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def _read_meta(path: Path, round_: int) -> dict:
    """meta.json of a checkpoint directory; ValueError/OSError when it is missing, not JSON, or names
    another round than the directory does (the writer never makes either)."""
    meta = json.loads((path / "meta.json").read_text())
    if not isinstance(meta, dict) or not isinstance(meta.get("round"), int) or meta["round"] != round_:
        raise ValueError(f"meta.json does not name round {round_}")
    return meta


def list_checkpoints(state_dir: Path) -> list[Checkpoint]:
    """Checkpoints whose meta.json reads, oldest first (their other files are read only when restored)."""
    out = []
    for round_, p in _checkpoint_dirs(state_dir):
        try:
            out.append(Checkpoint(round=round_, path=p, meta=_read_meta(p, round_)))
        except (ValueError, TypeError, OSError):
            continue  # unreadable: not a checkpoint we can resume from
    return out


def latest_checkpoint(state_dir: Path) -> Checkpoint | None:
    cks = list_checkpoints(state_dir)
    return cks[-1] if cks else None


def _check_fingerprint(ckpt: Checkpoint, config_fp: str) -> None:
    if ckpt.meta.get("config_fingerprint") != config_fp:
        raise UserFacingError(
            f"checkpoint {ckpt.path} was written with another model/task configuration "
            f"(fingerprint {ckpt.meta.get('config_fingerprint')} != {config_fp}); "
            "use a new --state-dir or the original config"
        )


class UnreadableCheckpoint(ValueError):
    """A file of a checkpoint cannot be read (cut short, garbled, missing); the message names the file."""


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    try:
        yield
    except UserFacingError:
        raise
    except Exception as exc:  # OSError, safetensors' and torch's own errors, ValueError of the checks here
        raise UnreadableCheckpoint(f"{path.name}: {_describe(exc)}") from exc


def read_checkpoint(ckpt: Checkpoint, model: Any, config_fp: str) -> tuple[dict, dict, torch.Tensor]:
    """Read and check every file of a checkpoint without changing anything: (weights, optimizer state, RNG).

    Raises UserFacingError for a checkpoint of another configuration or model, UnreadableCheckpoint for a
    file that cannot be read.
    """
    _check_fingerprint(ckpt, config_fp)
    weights_file = ckpt.path / (WEIGHTS_FILE if (ckpt.path / WEIGHTS_FILE).exists() else LEGACY_WEIGHTS_FILE)
    with _reading(weights_file):
        weights = load_weights(ckpt.path)
        if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
            raise ValueError("it holds no named tensors")
    _check_weights(ckpt, weights, model)
    with _reading(ckpt.path / "optimizer.pt"):
        opt_state = torch.load(ckpt.path / "optimizer.pt", map_location="cpu", weights_only=True)
        if not isinstance(opt_state, dict):
            raise ValueError(f"it holds a {type(opt_state).__name__}, not a state dict")
    with _reading(ckpt.path / "rng.pt"):
        rng = torch.load(ckpt.path / "rng.pt", weights_only=True)
        rng = rng.get("torch_rng") if isinstance(rng, dict) else None
        now = torch.get_rng_state()
        if not isinstance(rng, torch.Tensor) or rng.dtype != now.dtype or rng.shape != now.shape:
            raise ValueError("it holds no torch RNG state")
    return weights, opt_state, rng


def load_checkpoint(ckpt: Checkpoint, model: Any, config_fp: str) -> tuple[dict, dict]:
    """Restore weights and torch RNG in place; return (optimizer state, meta). Nothing changes unless every
    file reads."""
    weights, opt_state, rng = read_checkpoint(ckpt, model, config_fp)
    _copy_weights(weights, model)
    torch.set_rng_state(rng)
    return opt_state, ckpt.meta


def set_aside(path: Path, why: str) -> Path | None:
    """Rename an unreadable checkpoint to `<name>.unreadable` (kept for a look, never resumed from or pruned),
    with one logged line; None if even the rename failed (logged too)."""
    target = path.with_name(path.name + UNREADABLE)
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{UNREADABLE}-{n}")
    try:
        os.replace(path, target)
    except OSError as exc:
        log.warning("checkpoint %s is unreadable (%s) and could not be set aside (%s); not resuming from it",
                    path, why, exc)
        return None
    log.warning("checkpoint %s is unreadable (%s): set aside as %s; resuming from the one before it, if any "
                "(delete the .unreadable copy once looked at)", path.name, why, target.name)
    return target


def restore_newest(state_dir: Path, model: Any, trainer: Any, config_fp: str) -> Checkpoint | None:
    """Restore the newest readable checkpoint into `model` and `trainer` (its `load_state_dict`), after
    removing crash leftovers. None: nothing to resume (the model and trainer are as they came).

    A newer checkpoint that cannot be read (a file cut short by a crash or power loss, a missing or garbled
    meta.json) is set aside as `<name>.unreadable` with one logged line, and the one before is tried: so no
    later save ranks below it and none of the rounds trained after this restart is pruned in its favour.
    Every file of a checkpoint is read before any of it is applied, so a bad one changes nothing; a
    checkpoint of another configuration is refused (UserFacingError).
    """
    remove_partial(state_dir)
    before = copy.deepcopy(trainer.state_dict())  # a fresh trainer's: small (no optimizer moments yet)
    for round_, path in reversed(_checkpoint_dirs(state_dir)):
        try:
            with _reading(path / "meta.json"):
                ck = Checkpoint(round=round_, path=path, meta=_read_meta(path, round_))
            weights, opt_state, rng = read_checkpoint(ck, model, config_fp)
            with _reading(path / "optimizer.pt"):
                try:
                    trainer.load_state_dict(opt_state)
                except Exception:
                    trainer.load_state_dict(before)  # undo a half-applied state before trying the one before
                    raise
        except UnreadableCheckpoint as exc:
            set_aside(path, str(exc))
            continue
        _copy_weights(weights, model)
        torch.set_rng_state(rng)
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


def _check_weights(ckpt: Checkpoint, weights: dict[str, torch.Tensor], model: Any) -> None:
    """Every tensor of the checkpoint names a parameter of `model` of the same shape (else UserFacingError)."""
    params = dict(model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise UserFacingError(f"checkpoint {ckpt.path} does not match the model (unknown tensors: {missing[:3]})")
    wrong = [n for n, t in weights.items() if tuple(t.shape) != tuple(params[n].shape)]
    if wrong:
        raise UserFacingError(f"checkpoint {ckpt.path} does not match the model (other shapes: {wrong[:3]})")


def _copy_weights(weights: dict[str, torch.Tensor], model: Any) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, t in weights.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))


def restore_weights(ckpt: Checkpoint, model: Any) -> None:
    """Copy a checkpoint's tensors into `model` in place (names and shapes must be the model's trainable ones)."""
    weights = load_weights(ckpt.path)
    _check_weights(ckpt, weights, model)
    _copy_weights(weights, model)


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
