"""Activation bytes per token, measured on one layer of the real architecture at its real width.

A formula per architecture (norms, rotary, grouped-query attention, gated MLPs, autocast's casts) would drift
with every transformers release. Instead the plan builds the model with one layer and a small vocabulary
(uninitialised weights: no init cost), runs its body forward on a few tokens under the node's compute dtype
and LoRA setting, and counts the bytes of every tensor autograd saves for the backward pass
(`torch.autograd.graph.saved_tensors_hooks`), inside the layer and outside it. Two token counts separate
the part that grows with tokens from the part that does not (autocast's bf16 copies of the layer's weights).
It takes under a second for a 0.5B-wide layer, a few seconds for a 7B-wide one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from swarm_node.config import LoraConfig

PROBE_VOCAB = 256
PROBE_ROWS = 2
PROBE_LENGTHS = (32, 64)


@dataclass(frozen=True)
class ActivationCost:
    """Saved-for-backward bytes of one forward, as measured by the probe."""

    layer_per_token: float     # inside one transformer layer, per token
    layer_fixed: float         # inside one layer, independent of tokens (autocast's weight copies)
    outside_per_token: float   # embedding, final norm, rotary tables, per token
    layer_input_per_token: float  # what a checkpointed layer keeps: its input hidden states


def _one_layer(hf_config: Any) -> Any:
    cfg = copy.deepcopy(hf_config)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    text.num_hidden_layers = 1
    text.vocab_size = PROBE_VOCAB
    for key in ("layer_types", "mlp_only_layers"):
        value = getattr(text, key, None)
        if isinstance(value, list) and value:
            setattr(text, key, value[:1])
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value >= PROBE_VOCAB:
            setattr(text, key, 0)
    return cfg


def activation_probe(hf_config: Any, compute_dtype: torch.dtype, lora: LoraConfig | None = None) -> ActivationCost:
    """Measure the activation cost of the model `hf_config` describes (see the module docstring)."""
    from transformers import AutoModelForCausalLM

    from swarm_node.models.loading import decoder_layers, wrap_lora
    from swarm_node.models.precision import autocast_forwards, storage_dtype

    lora_on = bool(lora and lora.enabled)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_one_layer(hf_config))
    model = model.to_empty(device="cpu").to(storage_dtype(compute_dtype, lora_on))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    if lora_on:
        model = wrap_lora(model, lora)
    autocast_forwards(model, compute_dtype)
    model.eval()
    base = model.get_base_model() if lora_on else model
    body = base.get_decoder()
    layer = decoder_layers(model)[0]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weights |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    counts = [_saved_bytes(body, layer, weights, length) for length in PROBE_LENGTHS]
    (t1, in1, out1, li1), (t2, in2, out2, li2) = counts
    per_token = (in2 - in1) / (t2 - t1)
    return ActivationCost(layer_per_token=per_token, layer_fixed=max(0.0, in1 - per_token * t1),
                          outside_per_token=max(0.0, (out2 - out1) / (t2 - t1)), layer_input_per_token=li2 / t2)


def _saved_bytes(body: Any, layer: Any, weights: set[int], length: int) -> tuple[int, int, int, int]:
    """One forward of PROBE_ROWS rows of `length` tokens -> (tokens, bytes saved inside the layer, outside it,
    the layer's input hidden states)."""
    inside: dict[int, int] = {}
    outside: dict[int, int] = {}
    layer_input = [0]
    where = [outside]

    def enter(_m: Any, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        layer_input[0] = hidden.numel() * hidden.element_size()
        where[0] = inside

    def leave(*_: Any) -> None:
        where[0] = outside

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            where[0].setdefault(storage.data_ptr(), storage.nbytes())
        return t

    hooks = [layer.register_forward_pre_hook(enter, with_kwargs=True), layer.register_forward_hook(leave)]
    ids = torch.ones((PROBE_ROWS, length), dtype=torch.long)
    attn = torch.ones_like(ids)
    attn[0, : length // 4] = 0  # left padding, as the trainer's rows have: a mask is built
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
            body(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return PROBE_ROWS * length, sum(inside.values()), sum(outside.values()), layer_input[0]
