"""The built-in tiny presets: their table, where their builds are cached, and default learning rates.

The base module of `swarm_node.models`: the factory (which builds presets) and the loader (which loads
any model, presets included) both read it, and it imports neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FACTORY_VERSION = 3   # bump when a recipe changes: cached presets are rebuilt
PRESET_META_FILE = "swarm_node.json"  # written by the factory: preset name, default lrs, warm-up score, sha256
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]
BUILD_THREADS = 1  # torch threads during a build: fixed, so the weights do not depend on the machine's cores

# Defaults for models that are not presets (the F-TIS paper's values for 1.5B-3B models).
REAL_MODEL_LR = {"full": 1e-6, "lora": 1e-4}
REAL_MODEL_DPO_LR = {"full": 1e-6, "lora": 1e-4}


@dataclass(frozen=True)
class Preset:
    arch: str            # "llama" or "qwen2"
    hidden: int
    layers: int
    heads: int           # head_dim = hidden / heads >= 32: vLLM's CPU attention refuses smaller heads
    kv_heads: int
    intermediate: int
    lr_full: float       # default GRPO learning rate, full parameters (docs/algorithms.md: the sweep)
    lr_lora: float       # default GRPO learning rate, LoRA adapter
    lr_dpo: float = 3e-3  # default DPO learning rate (full or LoRA)
    # Warm-up recipe: a fixed number of steps, no adaptive stop, so a build is the same on every machine.
    warmup_steps: int = 600           # fixed stop (chosen so the id split starts near 30%)
    warmup_horizon: int = 1500        # cosine horizon: the schedule is the same whatever warmup_steps is
    warmup_lr: float = 3e-3           # peak; linear warm-up then cosine decay to warmup_min_lr_frac * peak
    warmup_lr_steps: int = 50
    warmup_min_lr_frac: float = 0.1
    warmup_batch: int = 128
    warmup_clip: float = 1.0
    warmup_log_every: int = 100       # progress lines (a 200-prompt greedy check on training prompts)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


PRESETS: dict[str, Preset] = {
    # Steps measured on the held-out id split (seed 0, horizon 1500): tiny-s 0.18 at 800, 0.27 at 900,
    # 0.17 at 950 (accuracy oscillates while the rate is high; the schedule is fixed, so this is the same on
    # every machine); tiny-m 0.12 at 500, 0.27 at 700, 0.45 at 800. Fewer heads learn this task much more
    # slowly (tiny-s with 2 heads of 32 was at 0.15 after 1000 steps), hence 4 heads of 32.
    "tiny-s": Preset("llama", hidden=128, layers=2, heads=4, kv_heads=4, intermediate=256,
                     lr_full=3e-5, lr_lora=3e-4, warmup_steps=900),
    "tiny-m": Preset("qwen2", hidden=96, layers=3, heads=3, kv_heads=1, intermediate=384,
                     lr_full=3e-5, lr_lora=3e-4, warmup_steps=700),
}


def default_presets_dir() -> Path:
    """Where presets are cached: $SWARM_NODE_PRESETS or ~/.cache/swarm-node/presets-v<version>."""
    env = os.environ.get("SWARM_NODE_PRESETS")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "swarm-node" / f"presets-v{FACTORY_VERSION}"


def preset_dir(name: str, presets_dir: str | Path | None = None) -> Path:
    return (Path(presets_dir) if presets_dir else default_presets_dir()) / name


def default_lr(meta: dict, is_lora: bool, mode: str = "grpo") -> float:
    """The learning rate used when the config leaves it unset: the one copy of this policy.

    A preset (named in its meta file) takes the current table's value, not one frozen into an older
    build; any other model takes the paper's defaults for real models.
    """
    preset = PRESETS.get(str(meta.get("preset")))
    kind = "lora" if is_lora else "full"
    if mode == "dpo":
        return preset.lr_dpo if preset is not None else REAL_MODEL_DPO_LR[kind]
    if mode != "grpo":
        raise ValueError(f"unknown mode {mode!r}")
    if preset is not None:
        return preset.lr_lora if is_lora else preset.lr_full
    return float(meta.get(f"lr_{kind}", REAL_MODEL_LR[kind]))
