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

    Defaults fit a GRPO round of a 0.5B-7B model (e.g. 64 prompts x 16 completions x 4k tokens = 2**22
    completion tokens) with 2x room, while keeping the worst-case memory of one decode to a few hundred
    MiB. A node builds tighter limits from its own round size (grpo.limits.receive_limits); the
    decompressed-body cap and msgpack's length limits follow from these fields (`body_cap`,
    `msgpack_limits`), so every bound of a decode scales with what the node itself would send.
    """

    max_compressed_bytes: int = 64 * MiB
    max_decompressed_bytes: int = 256 * MiB
    max_groups: int = 4096
    max_completions_per_group: int = 1024
    max_completions: int = 65536
    max_prompt_tokens: int = 65536
    max_tokens_per_completion: int = 65536
    max_total_tokens: int = 1 << 23
    max_string_bytes: int = 512  # utf-8 bytes of each string field (ids, names, fingerprints)
    max_vocab_size: int = 1 << 24
    max_map_keys: int = 64  # slots of the body array (35 in 2.0; slots past them are ignored)

    def body_cap(self) -> int:
        """Bytes of the largest msgpack body any batch within these limits can need, capped by
        `max_decompressed_bytes`: 4 strings, G prompt-id templates, 4 count columns of G and 8 numbers
        per id, 3 of C (lengths, prefix sources and lengths), a reward table of C float64s and C reward
        indices, and at most 4 bytes per palette entry, index and quantized log-prob, plus 4 KiB for keys
        and small fields.
        """
        s, g, c, t = self.max_string_bytes, self.max_groups, self.max_completions, self.max_total_tokens
        palette = min(self.max_vocab_size, t)
        need = 4 * (s + 5) + g * (s + 5) + 12 * g + 32 * g + 12 * c + 12 * c + 4 * palette + 8 * t + 4096
        return min(self.max_decompressed_bytes, need)

    def msgpack_limits(self) -> dict[str, int]:
        """Length limits for msgpack.unpackb: no string, bin, array or map longer than a valid body has.

        Strings get 4x their limit (and arrays 2x) so that a long one is still refused by name by the field
        checks (`string_too_long`, `schema`).
        """
        t, c = self.max_total_tokens, self.max_completions
        return {
            "max_str_len": 4 * self.max_string_bytes,
            "max_bin_len": max(4 * t, 8 * c, self.max_groups * (self.max_string_bytes + 32), 4 * min(self.max_vocab_size, t)),
            "max_array_len": self.max_map_keys,  # the body is one flat array of slots (35 in 2.0); nothing else is an array
            "max_map_len": self.max_map_keys,
            "max_ext_len": self.max_string_bytes,
        }
