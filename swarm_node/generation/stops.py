"""Which token ids end a completion: the tokenizer's EOS plus every EOS id in the model's generation_config.

Instruct checkpoints often list several (Llama 3: <|end_of_text|>, <|eot_id|>; Qwen2.5: <|endoftext|>,
<|im_end|>); stopping only at the tokenizer's EOS would run every chat completion to max_new_tokens.
Both backends stop at the same set, so their samples mean the same.
"""

from __future__ import annotations

from typing import Any


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Tokenizer EOS first, then the generation_config's EOS ids (int or list), without repeats."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if extra is not None:
        ids.extend(int(t) for t in (extra if isinstance(extra, (list, tuple)) else [extra]))
    out = list(dict.fromkeys(ids))
    if not out:
        raise ValueError("the tokenizer has no eos_token and the model's generation_config names no eos_token_id")
    return out
