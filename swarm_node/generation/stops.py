"""Which token ids end a completion: the tokenizer's EOS plus every EOS id in the model's generation_config.

Instruct checkpoints often list several (Llama 3: <|end_of_text|>, <|eot_id|>; Qwen2.5: <|endoftext|>,
<|im_end|>); stopping only at the tokenizer's EOS would run every chat completion to max_new_tokens.
Both backends stop at the same set, so their samples mean the same, and both take it through
`stop_id_list` (one id or several, never none).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


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


def stop_id_list(ids: int | Iterable[int], name: str = "stop_token_ids") -> list[int]:
    """One stop id or several as a list of ints (the first is "the" EOS); refuses an empty list."""
    stops = [int(ids)] if isinstance(ids, (int, np.integer)) else [int(t) for t in ids]
    if not stops:
        raise ValueError(f"{name} must name at least one stop token (the EOS)")
    return stops
