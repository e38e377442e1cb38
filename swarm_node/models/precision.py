"""Mixed precision: the weights that Adam steps stay in fp32, the forward computes in bf16 (or fp16).

Adam stepping bf16 weights directly loses every update below bf16's resolution (about 2^-8 of the weight):
at lr 1e-6 a bf16 tiny-s node moved 0.9% of its weight elements in 3 rounds where fp32 moved all of them.
So `model.dtype` names the *compute* dtype. The weights training changes are kept in fp32 (a full model's
parameters; a LoRA model's adapter), and the model's decoder body and output head run under
`torch.autocast`, so every caller (the sampler, the trainer's recompute, evaluation, DPO) computes the same
way. A LoRA model's frozen base weights are stored in the compute dtype: they are never stepped.

Memory per parameter of a full model, bf16 compute: 4 B fp32 weight + 4 B fp32 gradient + 8 B Adam state,
plus the bf16 copies autocast makes of the weights during a forward (2 B, held until the backward). A LoRA
model: 2 B per frozen base parameter, the adapter's 16 B per parameter, the same autocast copies of the
adapter only.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """`model.dtype`: bf16 on a GPU that supports it, fp32 on CPU (unless the config says otherwise)."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def storage_dtype(compute: torch.dtype, lora: bool) -> torch.dtype:
    """The dtype the model is loaded in: fp32 for weights that are trained, the compute dtype for a LoRA
    model's frozen base (peft keeps its adapter in fp32)."""
    return compute if lora else torch.float32


def _body_and_head(model: Any) -> list[Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parts = []
    try:
        parts.append(base.get_decoder())
    except (AttributeError, ValueError):
        pass
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if head is not None:
        parts.append(head)
    return parts or [base]


def autocast_forwards(model: Any, dtype: torch.dtype) -> None:
    """Run the model's decoder body and output head under `torch.autocast(dtype)` wherever they are called
    (a forward of the whole model calls both). A no-op for fp32."""
    if dtype == torch.float32:
        return
    for module in _body_and_head(model):
        if getattr(module, "_swarm_autocast", None) == dtype:
            continue
        forward = module.forward

        @functools.wraps(forward)
        def run(*args: Any, _forward: Any = forward, _module: Any = module, **kwargs: Any) -> Any:
            with torch.autocast(next(_module.parameters()).device.type, dtype=dtype):
                return _forward(*args, **kwargs)

        module.forward = run  # an instance attribute: parameter names and the state_dict are unchanged
        module._swarm_autocast = dtype


def trainable_dtypes(model: Any) -> set[torch.dtype]:
    """The dtypes of the parameters training changes (fp32 under mixed precision)."""
    return {p.dtype for p in model.parameters() if p.requires_grad}
