"""Tiny offline models: a shared character-level tokenizer and small Llama/Qwen2-style presets.

A base model that starts at 0% gives GRPO nothing to learn from, so each preset is warmed up by supervised
training on the built-in arithmetic task until it reaches a *partial* skill (target ~30% greedy exact
match, always inside 15-60%), then saved with `save_pretrained` so it loads through the same
`from_pretrained` path as a real checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

FACTORY_VERSION = 2   # bump when a recipe changes: cached presets are rebuilt
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]
MAX_THREADS = 4  # torch threads used for a build (restored afterwards)


@dataclass(frozen=True)
class Preset:
    arch: str            # "llama" or "qwen2"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    lr_full: float       # default GRPO learning rate, full parameters
    lr_lora: float       # default GRPO learning rate, LoRA adapter
    # Warm-up recipe (measured on 2 CPU cores: ~600-1100 steps to reach the target, 20-35 s).
    warmup_lr: float = 3e-3          # peak; linear warm-up then cosine decay to warmup_min_lr_frac * peak
    warmup_lr_steps: int = 50
    warmup_min_lr_frac: float = 0.1
    warmup_batch: int = 128
    warmup_max_steps: int = 1500     # cosine horizon and hard cap (stopping early is the normal case)
    warmup_clip: float = 1.0
    warmup_eval_every: int = 50      # a 200-prompt greedy check costs ~0.1 s, so checking often is cheap
    target_accuracy: float = 0.30


PRESETS: dict[str, Preset] = {
    "tiny-s": Preset("llama", hidden=64, layers=2, heads=4, kv_heads=4, intermediate=256, lr_full=3e-5, lr_lora=3e-4),
    "tiny-m": Preset("qwen2", hidden=96, layers=3, heads=4, kv_heads=2, intermediate=384, lr_full=3e-5, lr_lora=3e-4),
}


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
    frac = min(1.0, (step - preset.warmup_lr_steps) / max(1, preset.warmup_max_steps - preset.warmup_lr_steps))
    lo = preset.warmup_min_lr_frac
    return peak * (lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * frac)))


def greedy_accuracy(model: Any, tokenizer: Any, task: Any, prompts: list, max_new_tokens: int = 8) -> float:
    """Greedy exact-match accuracy of `model` on `prompts` (the same routine as `swarm-node eval`)."""
    from swarm_node.generation.hf import TransformersGenerator, completion_text

    gen = TransformersGenerator(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                batch_size=256)
    ids = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    out = gen.generate(ids, 1, max_new_tokens=max_new_tokens, greedy=True)
    hits = [task.is_correct(p, completion_text(tokenizer, s[0])) for p, s in zip(prompts, out, strict=True)]
    return float(np.mean(hits)) if hits else 0.0


def build_tiny(
    preset_name: str,
    out_dir: str | Path,
    seed: int = 0,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
    max_steps: int | None = None,
) -> dict:
    """Build, warm up and save a preset into out_dir. Returns the metadata written to swarm_node.json.

    Warm-up stops as soon as greedy accuracy on held-in *training* prompts reaches the preset's target
    (the eval split is only scored once, at the end, so it never steers training). `max_steps` caps the
    warm-up below the preset's budget (tests use it to check determinism quickly).
    Same seed and thread count -> bit-identical weights.
    """
    from swarm_node.models.loading import PRESET_META_FILE
    from swarm_node.tasks.arithmetic import ArithmeticTask

    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; choose one of {sorted(PRESETS)}")
    preset = PRESETS[preset_name]
    say = progress or (lambda msg: None)
    t0 = time.time()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(min(prev_threads, MAX_THREADS))  # many threads only add sync cost at this size
    try:
        tokenizer = build_tokenizer()
        model = build_model(preset, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed)
        task = ArithmeticTask(seed=seed)
        eval_prompts = task.eval_prompts("id", 200)
        val_prompts = task.iid_prompts(200, np.random.default_rng(seed + 10_000))
        steps, val_acc, loss_val = 0, 0.0, float("nan")
        budget = preset.warmup_max_steps if max_steps is None else min(max_steps, preset.warmup_max_steps)
        if warmup and budget > 0:
            steps, val_acc, loss_val = _warm_up(model, tokenizer, task, preset, seed, budget, val_prompts,
                                                lambda msg: say(f"{preset_name}: {msg}"))
        eval_acc = greedy_accuracy(model, tokenizer, task, eval_prompts)
        model.eval()
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
        "warmup_steps": steps,
        "warmup_final_loss": None if math.isnan(loss_val) else round(loss_val, 4),
        "warmup_val_accuracy": val_acc,
        "eval_id_accuracy": eval_acc,
        "lr_full": preset.lr_full,
        "lr_lora": preset.lr_lora,
        "build_seconds": round(time.time() - t0, 2),
    }
    (out / PRESET_META_FILE).write_text(json.dumps(meta, indent=2))
    say(f"{preset_name}: saved to {out} ({meta['parameters']} parameters, id accuracy {eval_acc:.2f}, "
        f"{meta['build_seconds']} s)")
    return meta


def _warm_up(model: Any, tokenizer: Any, task: Any, preset: Preset, seed: int, budget: int,
             val_prompts: list, say: Callable[[str], None]) -> tuple[int, float, float]:
    """Supervised warm-up until train-split greedy accuracy reaches the target. Returns (steps, acc, loss)."""
    ids_all, lab_all = _sft_dataset(tokenizer, task)
    gen = torch.Generator().manual_seed(seed)
    pad = tokenizer.pad_token_id
    # No weight decay: the run is short and stops on accuracy, decay only slowed it in measurements.
    opt = torch.optim.AdamW(model.parameters(), lr=preset.warmup_lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.train()
    steps, val_acc, loss_val = 0, 0.0, float("nan")
    while steps < budget:
        for group in opt.param_groups:
            group["lr"] = _lr_at(preset, steps)
        idx = torch.randint(0, ids_all.shape[0], (preset.warmup_batch,), generator=gen)
        ids, lab = ids_all[idx], lab_all[idx]
        width = int((ids != pad).sum(1).max())
        # Right padding under a causal mask never reaches a real token, so no attention mask is needed.
        loss = model(input_ids=ids[:, :width], labels=lab[:, :width]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), preset.warmup_clip)
        opt.step()
        steps += 1
        if steps % preset.warmup_eval_every == 0 or steps == budget:
            loss_val = float(loss.item())
            val_acc = greedy_accuracy(model, tokenizer, task, val_prompts)
            say(f"warm-up step {steps}, loss {loss_val:.3f}, train-split accuracy {val_acc:.2f}")
            if val_acc >= preset.target_accuracy:
                break
    return steps, val_acc, loss_val


def default_presets_dir() -> Path:
    """Where presets are cached: $SWARM_NODE_PRESETS or ~/.cache/swarm-node/presets-v<version>."""
    env = os.environ.get("SWARM_NODE_PRESETS")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "swarm-node" / f"presets-v{FACTORY_VERSION}"


def ensure_preset(name: str, presets_dir: str | Path | None = None, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> Path:
    """Return the directory of a built preset, building it once (safe when several processes race)."""
    root = Path(presets_dir) if presets_dir else default_presets_dir()
    target = root / name
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():
            return target
        tmp = root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        say = progress or (lambda msg: log.info(msg))
        say(f"building preset {name} into {target} (once; 20-40 s on 2 CPU cores)")
        build_tiny(name, tmp, seed=seed, progress=say)
        os.replace(tmp, target)
        say(f"{name} ready in {target}")
    return target
