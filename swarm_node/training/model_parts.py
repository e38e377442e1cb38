"""What the trainer needs to know of a model: its body and output head (so the head runs on completion
positions only), the names its forward accepts, its vocabulary, dropout off while log-probs are recomputed,
and the prompts' shared prefix (one forward for it)."""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import nn


def release_cached_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def base_model(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def forward_names(model: nn.Module) -> set[str]:
    """The names the (underlying) model's forward accepts (a peft wrapper forwards **kwargs to it)."""
    fwd = base_model(model).forward if hasattr(model, "get_base_model") else model.forward
    return set(inspect.signature(fwd).parameters)


def body_and_head(model: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """(decoder body, output head) when the head is a plain map of the body's last hidden states, so that the
    trainer can run it on completion positions alone, a chunk at a time; (None, None) for models that
    post-process their logits (soft-capping, scaling), which then compute their logits themselves."""
    base = base_model(model)
    cfg = getattr(base, "config", None)
    if any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in ("final_logit_softcapping", "logit_scale",
                                                                  "logits_scaling", "output_multiplier_scale")):
        return None, None
    get_decoder, get_head = getattr(base, "get_decoder", None), getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None, None
    try:
        body, head = get_decoder(), get_head()
    except (AttributeError, ValueError, NotImplementedError):
        return None, None
    if body is None or head is None or body is base:
        return None, None
    return body, head


def vocab_size(model: nn.Module) -> int:
    cfg = getattr(base_model(model), "config", None)
    return int(getattr(cfg, "vocab_size", 0) or 0)


def shared_prefix(prompts: list[np.ndarray]) -> int:
    """Length of the longest prefix every prompt starts with."""
    n = min(len(p) for p in prompts)
    heads = np.stack([p[:n] for p in prompts])
    differ = np.flatnonzero((heads != heads[0]).any(axis=0))
    return int(differ[0]) if differ.size else n


class eval_mode:
    """Disable dropout while recomputing log-probs (dropout would bias the ratios); restore after."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.was_training = model.training

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was_training)
