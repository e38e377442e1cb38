"""A model's shape, read from its config alone: the sizes a memory plan needs, without loading a weight.

The architecture is built on torch's meta device (no memory, no init), so parameter counts are exact for
any transformers model: tied embeddings counted once, biases and norms included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm_node.config import LoraConfig
from swarm_node.errors import UserFacingError


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan reads about a model."""

    name: str
    architecture: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    max_positions: int
    params: int           # every parameter, tied ones once
    linear_params: int    # in nn.Linear layers, the output head included (what autocast copies to bf16)
    embed_params: int     # the input embedding
    tied: bool            # the output head shares the input embedding
    adapter_params: int = 0  # LoRA: the adapter's parameters (0 for a full model)

    @property
    def trained_params(self) -> int:
        return self.adapter_params or self.params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def load_hf_config(path: str) -> Any:
    """The transformers config of a model directory (or hub id where the hub is reachable)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise UserFacingError(f"cannot read the model config of {path!r}: {exc}") from exc


def model_shape(hf_config: Any, lora: LoraConfig | None = None, name: str = "") -> ModelShape:
    """The shape of the model `hf_config` describes (with `lora`, its adapter's size too)."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    tied = head is not None and head.weight is embed.weight
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    heads = int(cfg.num_attention_heads)
    hidden = int(cfg.hidden_size)
    shape = ModelShape(
        name=name or str(getattr(cfg, "_name_or_path", "") or cfg.model_type),
        architecture=type(model).__name__,
        vocab=int(cfg.vocab_size),
        hidden=hidden,
        layers=int(cfg.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
        intermediate=int(getattr(cfg, "intermediate_size", 4 * hidden)),
        max_positions=int(getattr(cfg, "max_position_embeddings", 0) or 0),
        params=params,
        linear_params=linear,  # a tied head is a Linear too, whose weight is the embedding
        embed_params=embed.weight.numel(),
        tied=tied,
        adapter_params=adapter_size(model, lora) if lora is not None and lora.enabled else 0,
    )
    del model
    return shape


def adapter_size(model: Any, lora: LoraConfig) -> int:
    """Parameters of a LoRA adapter of rank r on `lora.target_modules` (peft's "all-linear": every Linear
    but the output head): r x (inputs + outputs) per adapted layer."""
    from torch import nn

    head = model.get_output_embeddings()
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module is head:
            continue
        if lora.target_modules != "all-linear" and not any(
                name == t or name.endswith("." + t) for t in lora.target_modules):
            continue
        total += lora.r * (module.in_features + module.out_features)
    return total


def shape_of(path: str, lora: LoraConfig | None = None) -> ModelShape:
    """The shape of the model at `path` (a directory, a preset's directory, or a hub id)."""
    return model_shape(load_hf_config(path), lora, name=Path(path).name or path)

