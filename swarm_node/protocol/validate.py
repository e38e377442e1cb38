"""Field checks shared by the encoder (catch a bad batch before it leaves) and the decoder (reject a peer's)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .batch import DecodeLimits
from .errors import ProtocolError

INT64_MAX = (1 << 63) - 1


def check_str(value: Any, name: str, limits: DecodeLimits) -> str:
    """A str of at most limits.max_string_bytes utf-8 bytes."""
    if not isinstance(value, str):
        raise ProtocolError("schema", f"{name} is {type(value).__name__}, not str")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ProtocolError("schema", f"{name} is not valid unicode") from None
    if size > limits.max_string_bytes:
        raise ProtocolError("string_too_long", f"{name} has {size} bytes > {limits.max_string_bytes}")
    return value


def check_int(value: Any, name: str) -> int:
    """A real int (bool and numpy scalars excluded on the wire, numpy ints accepted on encode)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ProtocolError("schema", f"{name} is {type(value).__name__}, not int")
    return int(value)


def check_header_fields(round_: Any, vocab_size: Any, limits: DecodeLimits) -> tuple[int, int]:
    """round in [0, 2**63) and vocab_size in [2, limits.max_vocab_size]."""
    round_ = check_int(round_, "round")
    if not 0 <= round_ <= INT64_MAX:
        raise ProtocolError("round", f"round {round_} not in [0, 2**63)")
    vocab_size = check_int(vocab_size, "vocab_size")
    if not 2 <= vocab_size <= limits.max_vocab_size:
        raise ProtocolError("vocab_size", f"vocab_size {vocab_size} not in [2, {limits.max_vocab_size}]")
    return round_, vocab_size


def check_counts(
    group_sizes: np.ndarray, prompt_lens: np.ndarray, completion_lens: np.ndarray, limits: DecodeLimits
) -> None:
    """Per-group, per-sequence and total bounds on the batch's shape."""
    if len(group_sizes) > limits.max_groups:
        raise ProtocolError("too_many_groups", f"{len(group_sizes)} groups > {limits.max_groups}")
    if len(group_sizes) and int(group_sizes.max()) > limits.max_completions_per_group:
        raise ProtocolError(
            "too_many_completions",
            f"a group has {int(group_sizes.max())} completions > {limits.max_completions_per_group}",
        )
    if len(completion_lens) > limits.max_completions:
        raise ProtocolError("too_many_completions", f"{len(completion_lens)} completions > {limits.max_completions}")
    if len(prompt_lens) and int(prompt_lens.max()) > limits.max_prompt_tokens:
        raise ProtocolError("prompt_too_long", f"a prompt has {int(prompt_lens.max())} tokens > {limits.max_prompt_tokens}")
    if len(completion_lens) and int(completion_lens.max()) > limits.max_tokens_per_completion:
        raise ProtocolError(
            "completion_too_long",
            f"a completion has {int(completion_lens.max())} tokens > {limits.max_tokens_per_completion}",
        )
    total = int(prompt_lens.sum(dtype=np.int64)) + int(completion_lens.sum(dtype=np.int64))
    if total > limits.max_total_tokens:
        raise ProtocolError("too_many_tokens", f"{total} tokens > {limits.max_total_tokens}")


def check_rewards(rewards: np.ndarray) -> None:
    """Rewards must be finite: one NaN would poison the group's mean and std."""
    if not np.all(np.isfinite(rewards)):
        raise ProtocolError("reward_not_finite", "a reward is NaN or infinite")
