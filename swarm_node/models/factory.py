"""Tiny offline models: a shared character-level tokenizer and small Llama/Qwen2-style presets.

A base model that starts at 0% gives GRPO nothing to learn from, so each preset is warmed up by supervised
training on the built-in arithmetic task to a *partial* skill (about 30% greedy exact match on the held-out
`id` split), then saved with `save_pretrained` so it loads through the same `from_pretrained` path as a real
checkpoint.

Builds are reproducible: a fixed number of warm-up steps (no stop on a measured accuracy), one torch
thread (no OpenMP threads spinning against a busy core, and no reduction order that depends on the core
count), and the sha256 of the saved weights recorded in the preset's meta file.
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
    PRESET_META_FILE,
    PRESETS,
    SPECIAL_TOKENS,
    Preset,
    default_presets_dir,
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
) -> dict:
    """Build, warm up and save a preset into out_dir. Returns the metadata written to swarm_node.json.

    The warm-up runs the preset's fixed number of steps (`max_steps` stops it earlier on the same schedule:
    tests use it to check determinism quickly). The eval split is scored once, at the end, so it never
    steers training. Same seed -> the same bytes on any machine (one torch thread during the build).
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
        steps, loss_val = 0, float("nan")
        budget = preset.warmup_steps if max_steps is None else min(max_steps, preset.warmup_steps)
        if warmup and budget > 0:
            steps, loss_val = _warm_up(model, tokenizer, task, preset, seed, budget, val_prompts,
                                       lambda msg: say(f"{preset_name}: {msg}"))
        model.eval()
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
        "warmup_steps": steps,
        "build_threads": BUILD_THREADS,
        "warmup_final_loss": None if math.isnan(loss_val) else round(loss_val, 4),
        "warmup_val_accuracy": val_acc,
        "eval_id_accuracy": eval_acc,
        "eval_ood_accuracy": ood_acc,
        "lr_full": preset.lr_full,
        "lr_lora": preset.lr_lora,
        "sha256": weights_sha256(out),
        "build_seconds": round(time.time() - t0, 2),
    }
    (out / PRESET_META_FILE).write_text(json.dumps(meta, indent=2))
    say(f"{preset_name}: saved to {out} ({meta['parameters']} parameters, id accuracy {eval_acc:.2f}, "
        f"sha256 {meta['sha256'][:12]}, {meta['build_seconds']} s)")
    return meta


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 of the saved weights file: equal hashes mean bit-identical presets."""
    h = hashlib.sha256()
    with open(Path(model_dir) / WEIGHTS_FILE, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _warm_up(model: Any, tokenizer: Any, task: Any, preset: Preset, seed: int, budget: int,
             val_prompts: list, say: Callable[[str], None]) -> tuple[int, float]:
    """Supervised warm-up for exactly `budget` steps of the preset's schedule. Returns (steps, last loss)."""
    ids_all, lab_all = _sft_dataset(tokenizer, task)
    gen = torch.Generator().manual_seed(seed)
    pad = tokenizer.pad_token_id
    # No weight decay: the run is short, decay only slowed it in measurements.
    opt = torch.optim.AdamW(model.parameters(), lr=preset.warmup_lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.train()
    loss_val = float("nan")
    for step in range(budget):
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
        if (step + 1) % preset.warmup_log_every == 0 or step + 1 == budget:
            loss_val = float(loss.item())
            # progress only: the schedule is fixed, this number never decides anything
            acc = greedy_accuracy(model, tokenizer, task, val_prompts)
            model.train()
            say(f"warm-up step {step + 1}/{budget}, loss {loss_val:.3f}, train-split accuracy {acc:.2f}")
    return budget, loss_val


def _is_current(target: Path) -> bool:
    """A cached build of this factory version (an older recipe is rebuilt, not silently reused)."""
    try:
        meta = json.loads((target / PRESET_META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (target / "config.json").is_file() and meta.get("factory_version") == FACTORY_VERSION


def ensure_preset(name: str, presets_dir: str | Path | None = None, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> Path:
    """Return the directory of a built preset, building it once (safe when several processes race)."""
    root = Path(presets_dir) if presets_dir else default_presets_dir()
    target = root / name
    if _is_current(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(target):
            return target
        tmp = root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        say = progress or (lambda msg: log.info(msg))
        if target.exists():
            say(f"{target} was built by another factory version: rebuilding it")
        say(f"building preset {name} into {target} (once; about a minute on one CPU core)")
        build_tiny(name, tmp, seed=seed, progress=say)
        if target.exists():
            old = root / f".{name}.old-{os.getpid()}"
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
        say(f"{name} ready in {target}")
    return target
