"""Wire codec for rollout batches: data classes, limits, encode/decode with full validation (no torch)."""

from .batch import Completion, DecodeLimits, Group, RolloutBatch
from .codec import decode_batch, encode_batch
from .errors import REASONS, ProtocolError
from .framing import MAJOR, MINOR, max_payload_bytes

__all__ = [
    "MAJOR",
    "MINOR",
    "REASONS",
    "Completion",
    "DecodeLimits",
    "Group",
    "ProtocolError",
    "RolloutBatch",
    "decode_batch",
    "encode_batch",
    "max_payload_bytes",
]
