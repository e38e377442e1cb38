"""Stand-ins for real models, built offline: the architecture and vocabulary size of a public checkpoint
with random weights.

No machine here reaches a model hub, yet the GPU configs in peers/ name real models (Qwen2.5-0.5B/1.5B).
A stand-in has the same config (layers, widths, heads, vocabulary, tied head, rope) and a tokenizer with the
same chat form (ChatML), so a config can be validated, planned (`swarm-node plan`) and run for a round on a
CPU through the real `from_pretrained` path. It is right for memory and speed, not for learning: the
weights are random. The tokenizer is byte-level (every UTF-8 byte is a token, no merges), so its ids are a
small prefix of the model's vocabulary, as a real tokenizer's are of its padded embedding.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm_node.models.presets import FACTORY_VERSION, PRESET_META_FILE

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class Standin:
    """A public checkpoint's shape (from its config.json) and licence."""

    source: str
    model_type: str
    licence: str
    config: dict[str, Any] = field(default_factory=dict)


_QWEN25 = {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
           "hidden_act": "silu", "attention_dropout": 0.0, "use_sliding_window": False}

STANDINS: dict[str, Standin] = {
    "qwen2.5-0.5b-instruct": Standin("Qwen/Qwen2.5-0.5B-Instruct", "qwen2", "Apache-2.0", {
        **_QWEN25, "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "qwen2.5-1.5b-instruct": Standin("Qwen/Qwen2.5-1.5B-Instruct", "qwen2", "Apache-2.0", {
        **_QWEN25, "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "qwen2.5-3b-instruct": Standin("Qwen/Qwen2.5-3B-Instruct", "qwen2", "Qwen Research licence", {
        **_QWEN25, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "qwen2.5-7b-instruct": Standin("Qwen/Qwen2.5-7B-Instruct", "qwen2", "Apache-2.0", {
        **_QWEN25, "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "tie_word_embeddings": False}),
    "qwen3-0.6b": Standin("Qwen/Qwen3-0.6B", "qwen3", "Apache-2.0", {
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960}),
    "llama-3.2-1b-instruct": Standin("meta-llama/Llama-3.2-1B-Instruct", "llama", "Llama 3.2 Community licence", {
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
        "rope_theta": 500_000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072}),
    "smollm2-360m-instruct": Standin("HuggingFaceTB/SmolLM2-360M-Instruct", "llama", "Apache-2.0", {
        "vocab_size": 49152, "hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
        "num_attention_heads": 15, "num_key_value_heads": 5, "tie_word_embeddings": True,
        "rope_theta": 100_000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192}),
}


def standin_names() -> list[str]:
    return sorted(STANDINS)


def standin_config(name: str) -> Any:
    """The transformers config of a stand-in (its model type's config class with the checkpoint's values)."""
    from transformers import AutoConfig

    s = STANDINS[name]
    return AutoConfig.for_model(s.model_type, **s.config)


def byte_tokenizer(specials: list[str] = CHATML_SPECIALS, chat_template: str = CHATML) -> Any:
    """A byte-level tokenizer (256 byte tokens, no merges) with ChatML's special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(specials + sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=specials[2], pad_token=specials[0],
                                   model_max_length=32768)
    fast.chat_template = chat_template
    return fast


def build_standin(name: str, out: str | Path, seed: int = 0) -> dict:
    """Write the stand-in `name` (random weights, bf16 files) and its tokenizer to `out`; return its meta."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if name not in STANDINS:
        raise ValueError(f"unknown stand-in {name!r}; choose one of {standin_names()}")
    s = STANDINS[name]
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = byte_tokenizer()
    cfg = standin_config(name)
    cfg.pad_token_id = tok.pad_token_id
    cfg.eos_token_id = tok.eos_token_id
    cfg.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"),
                                                             tok.convert_tokens_to_ids("<|endoftext|>")],
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    meta = {"standin": name, "source_model": s.source, "licence_of_source": s.licence, "random_init": True,
            "seed": seed, "parameters": sum(p.numel() for p in model.parameters()), "arch": s.model_type,
            "factory_version": FACTORY_VERSION, "build_seconds": round(time.perf_counter() - t0, 1)}
    (out / PRESET_META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
    return meta
