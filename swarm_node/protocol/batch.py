"""Rollout batch data classes and decode limits: plain numpy containers, no torch, no validation here."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MiB = 1 << 20


@dataclass
class Completion:
    """One sampled completion: its token ids, the generator's per-token log-probs, and its reward."""

    token_ids: np.ndarray  # integer ids (int64 after decode), shape (n,)
    logprobs: np.ndarray  # float32 log pi_gen of each sampled token, shape (n,), all <= 0
    reward: float


@dataclass
class Group:
    """G completions of one prompt; GRPO advantages are computed within a group."""

    prompt_id: str
    prompt_ids: np.ndarray  # integer ids of the prompt (int64 after decode)
    completions: list[Completion] = field(default_factory=list)


@dataclass
class RolloutBatch:
    """What one node publishes per round; the metadata lets receivers decline what they cannot use."""

    swarm_id: str
    task_id: str
    tokenizer_fp: str  # tokenizer fingerprint: ids only mean something under the same tokenizer
    model_name: str
    round: int
    vocab_size: int
    groups: list[Group] = field(default_factory=list)

    def num_completion_tokens(self) -> int:
        """Total completion tokens, the denominator of the bytes-per-token figures."""
        return sum(len(c.token_ids) for g in self.groups for c in g.completions)


@dataclass(frozen=True)
class DecodeLimits:
    """Upper bounds a receiver enforces before and while decoding a peer's payload.

    Defaults fit a GRPO round of a 0.5B-7B model (e.g. 64 prompts x 16 completions x 4k tokens) with room
    to spare, while keeping the worst-case memory of one decode to a few hundred MiB.
    """

    max_compressed_bytes: int = 64 * MiB
    max_decompressed_bytes: int = 256 * MiB
    max_groups: int = 4096
    max_completions_per_group: int = 1024
    max_completions: int = 65536
    max_prompt_tokens: int = 65536
    max_tokens_per_completion: int = 65536
    max_total_tokens: int = 1 << 26
    max_string_bytes: int = 512  # utf-8 bytes of each string field (ids, names, fingerprints)
    max_vocab_size: int = 1 << 24
