"""What a node's config needs in memory, before it loads a weight (`swarm-node plan`, and the node's start).

`plan_node` reads the model's config (`shape.py`), measures one layer's activations (`probe.py`) and adds
up the parts (`memory.py`); `measure.py` measures real peaks to check the plan against.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from swarm_node.config import LoraConfig, NodeConfig
from swarm_node.errors import UserFacingError
from swarm_node.planning.memory import GIB, MemoryPlan, advise, describe, plan_memory
from swarm_node.planning.probe import activation_probe
from swarm_node.planning.shape import load_hf_config, model_shape

__all__ = ["GIB", "MemoryPlan", "check_fits", "device_memory", "parse_size", "plan_node"]


def parse_size(text: str) -> int:
    """'24GiB', '24GB', '80G', '512MiB' -> bytes (GB and G are read as GiB: cards are sold that way)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", text, re.I)
    if not match:
        raise UserFacingError(f"memory size {text!r} is not like 24GiB, 80GB or 512MiB")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def device_memory(device: torch.device) -> int:
    """What the device has: a GPU's total memory, or the machine's RAM (MemTotal) for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
    text = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    match = re.search(r"MemTotal:\s+(\d+) kB", text)
    return int(match.group(1)) * 1024 if match else 0


def _model_dir(path: str) -> str:
    from swarm_node.models.factory import ensure_preset
    from swarm_node.models.presets import preset_names

    return str(ensure_preset(path)) if path in preset_names() else path


def plan_node(cfg: NodeConfig, device: str | None = None, device_bytes: int | None = None,
              with_advice: bool = True) -> tuple[MemoryPlan, list]:
    """The memory plan of a GRPO node's config on `device` ("cuda"/"cpu"; default: where the node would run)
    of `device_bytes` (default: what that device has), and the settings that would make it fit."""
    from swarm_node.models.loading import pick_device
    from swarm_node.models.precision import compute_dtype

    if device is None:
        dev = pick_device(cfg.model.device)
    else:
        dev = torch.device(device)
    if device_bytes is None and (device is None or dev.type == "cpu" or torch.cuda.is_available()):
        device_bytes = device_memory(dev) or None
    if dev.type == "cuda" and cfg.model.dtype == "auto" and not torch.cuda.is_available():
        compute = torch.bfloat16  # planning a GPU from elsewhere: the GPU default
    else:
        compute = compute_dtype(cfg.model.dtype, dev)
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[compute]
    hf = load_hf_config(_model_dir(cfg.model.path))
    shapes: dict[bool, object] = {}
    costs: dict[bool, object] = {}

    def shape_for(lora: LoraConfig):
        if lora.enabled not in shapes:
            shapes[lora.enabled] = model_shape(hf, lora, name=Path(cfg.model.path).name)
        return shapes[lora.enabled]

    def cost_for(lora: LoraConfig):
        if lora.enabled not in costs:
            costs[lora.enabled] = activation_probe(hf, compute, lora)
        return costs[lora.enabled]

    plan = plan_memory(cfg, shape_for(cfg.model.lora), cost_for(cfg.model.lora), dev.type, device_bytes, name)
    advice = advise(cfg, shape_for, cost_for, dev.type, device_bytes, name, plan) \
        if with_advice and plan.fits is False else []
    return plan, advice


def check_fits(cfg: NodeConfig) -> MemoryPlan | None:
    """At a node's start: refuse, in one line, a config whose plan does not fit the device (cfg.memory_check),
    naming the change that makes it fit. None for a DPO node (the plan covers GRPO)."""
    if cfg.mode != "grpo" or not cfg.memory_check:
        return None
    try:
        plan, advice = plan_node(cfg)
    except UserFacingError:  # no readable config (an adapter directory, a hub id offline): loading says why
        return None
    if plan.fits is False:
        fix = (f"; it fits with --set {advice[0].change} (peak {advice[0].plan.peak / GIB:.1f} GiB)" if advice
               else "; no single setting makes it fit: use a smaller model")
        raise UserFacingError(f"this config cannot fit: {describe(plan)}{fix}. `swarm-node plan` shows the parts; "
                              "--set memory_check=false starts anyway")
    return plan
