"""The one exception a decoder raises, so callers can log-and-count a bad payload with a single except."""

from __future__ import annotations

# Machine-readable reasons. Receivers count rejections by reason, so keep these short and stable.
REASONS: frozenset[str] = frozenset(
    {
        "too_large",  # compressed payload bigger than DecodeLimits.max_compressed_bytes
        "truncated",  # shorter than the fixed header, or the zstd frame ends early
        "bad_magic",  # not a swarm-node rollout batch
        "version",  # major version this decoder does not know
        "bad_frame",  # zstd frame malformed, without content size, or disagreeing with the header
        "decompressed_too_large",  # declared decompressed size over DecodeLimits.max_decompressed_bytes
        "trailing_data",  # bytes after the zstd frame
        "msgpack",  # the decompressed body is not exactly one msgpack object
        "msgpack_limit",  # a msgpack string/bin/array/map over its length limit, or containers nested too deep
        "schema",  # a field missing, of the wrong type, or with an impossible value
        "string_too_long",
        "vocab_size",  # vocab_size < 2 or > DecodeLimits.max_vocab_size
        "round",  # round < 0 or not an int64
        "too_many_groups",
        "too_many_completions",  # in one group, or in the whole batch
        "prompt_too_long",
        "completion_too_long",
        "too_many_tokens",  # total tokens in the batch
        "length_mismatch",  # column sizes disagree with the counts they must match
        "missing_planes",  # a column of count > 0 with no byte planes (or bit width 0): its count is unbacked
        "id_out_of_range",  # a token id >= vocab_size (or negative, on encode)
        "logprob_not_finite",
        "logprob_positive",
        "reward_not_finite",
        "internal",  # a check we missed raised something else; counted, and a bug to fix (fuzzing finds none)
    }
)


class ProtocolError(Exception):
    """A payload (or a batch about to be encoded) breaks the wire contract; `.reason` is one of REASONS."""

    def __init__(self, reason: str, message: str = "") -> None:
        if reason not in REASONS:
            raise AssertionError(f"unknown ProtocolError reason {reason!r}")
        self.reason = reason
        self.message = message or reason
        super().__init__(f"{reason}: {self.message}")
