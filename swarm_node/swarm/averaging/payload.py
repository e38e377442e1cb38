"""The DPO parameter payload: encode and validate a node's trainable parameters for the wire.

Payloads are hivemind-compressed protobuf tensors behind a small fixed header, never pickles; a received
payload is hostile until `decode_params` has checked its header, the per-tensor compression, dtype, shape,
byte length and finiteness. Optimizer state is never sent.

Payload layout (little-endian):
    b"SNDP" | u8 version | 16 ascii bytes arch fingerprint | u32 tensor count |
    per tensor: u32 length | hivemind runtime_pb2.Tensor bytes
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from hivemind.compression import (
    Float16Compression,
    NoCompression,
    Uniform8BitQuantization,
    deserialize_torch_tensor,
    serialize_torch_tensor,
)
from hivemind.proto import runtime_pb2

from swarm_node.swarm.averaging.reasons import PARAM_REASONS

MAGIC = b"SNDP"
VERSION = 1
_HEADER = struct.Struct("<4sB16sI")
_LEN = struct.Struct("<I")
COMPRESSIONS: dict[str, Any] = {
    "none": NoCompression(),
    "float16": Float16Compression(),
    "uint8": Uniform8BitQuantization(),
}


class PayloadError(ValueError):
    """A peer's parameters were refused; `reason` is a short counter key, one of swarm/averaging/reasons.py's."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in PARAM_REASONS:
            raise AssertionError(f"unknown parameter refusal reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def encode_params(tensors: Sequence[torch.Tensor], arch_fp: str, compression: str = "float16") -> bytes:
    """Serialize float32 tensors with one hivemind compression each (per tensor: better 8-bit scales)."""
    comp = COMPRESSIONS[compression]
    fp = arch_fp.encode("ascii")[:16].ljust(16, b"0")
    parts = [_HEADER.pack(MAGIC, VERSION, fp, len(tensors))]
    for t in tensors:
        t32 = t.detach().to("cpu", torch.float32).contiguous()
        blob = serialize_torch_tensor(t32, comp.compression_type).SerializeToString()
        parts.append(_LEN.pack(len(blob)))
        parts.append(blob)
    return b"".join(parts)


def _expected_buffer_len(compression: str, numel: int) -> int:
    if compression == "none":
        return 4 * numel
    if compression == "float16":
        return 2 * numel
    return 8 + 4 * 256 + numel  # uint8: int64 codebook size, 256 float32 codebook entries, indices


def _extract(msg: runtime_pb2.Tensor, compression: str, numel: int) -> torch.Tensor:
    """Decode an already validated tensor message.

    8-bit is decoded here: hivemind 1.1.12's Quantization.extract calls int() on a 1-element array, which
    numpy 2 refuses. The layout is hivemind's: int64 codebook size, float32 codebook, uint8 indices.
    """
    if compression != "uint8":
        return deserialize_torch_tensor(msg).detach().to(torch.float32)
    codebook = np.frombuffer(msg.buffer, dtype=np.float32, count=256, offset=8)
    indices = np.frombuffer(msg.buffer, dtype=np.uint8, count=numel, offset=8 + 4 * 256)
    return torch.from_numpy(codebook[indices].astype(np.float32))


def decode_params(
    payload: bytes,
    shapes: Sequence[torch.Size | tuple[int, ...]],
    arch_fp: str,
    compression: str = "float16",
    max_bytes: int | None = None,
) -> list[torch.Tensor]:
    """Validate and decode a peer's payload against OUR shapes; raises PayloadError with a reason key."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise PayloadError("type", f"payload is {type(payload).__name__}, not bytes")
    payload = bytes(payload)
    if max_bytes is not None and len(payload) > max_bytes:
        raise PayloadError("too_large", f"{len(payload)} bytes > limit {max_bytes}")
    if len(payload) < _HEADER.size:
        raise PayloadError("truncated", f"{len(payload)} bytes is shorter than the header")
    magic, version, fp, count = _HEADER.unpack_from(payload, 0)
    if magic != MAGIC or version != VERSION:
        raise PayloadError("bad_header", f"magic {magic!r} version {version}")
    if fp != arch_fp.encode("ascii")[:16].ljust(16, b"0"):
        raise PayloadError("arch_mismatch", f"peer architecture {fp!r} differs from ours {arch_fp!r}")
    if count != len(shapes):
        raise PayloadError("wrong_count", f"{count} tensors, expected {len(shapes)}")
    comp = COMPRESSIONS[compression]
    off = _HEADER.size
    out: list[torch.Tensor] = []
    for k, shape in enumerate(shapes):
        if off + _LEN.size > len(payload):
            raise PayloadError("truncated", f"tensor {k}: missing length")
        (n,) = _LEN.unpack_from(payload, off)
        off += _LEN.size
        if off + n > len(payload):
            raise PayloadError("truncated", f"tensor {k}: {n} bytes announced, {len(payload) - off} left")
        msg = runtime_pb2.Tensor()
        try:
            msg.ParseFromString(payload[off: off + n])
        except Exception as exc:  # protobuf DecodeError and friends
            raise PayloadError("bad_proto", f"tensor {k}: {exc}") from None
        off += n
        numel = int(np.prod(shape)) if len(shape) else 1
        if msg.compression != comp.compression_type or msg.dtype != "float32":
            raise PayloadError("bad_encoding", f"tensor {k}: compression {msg.compression} dtype {msg.dtype!r}")
        if tuple(msg.size) != tuple(shape):
            raise PayloadError("wrong_shape", f"tensor {k}: shape {tuple(msg.size)}, expected {tuple(shape)}")
        if len(msg.buffer) != _expected_buffer_len(compression, numel):
            raise PayloadError("wrong_size", f"tensor {k}: {len(msg.buffer)} buffer bytes")
        if compression == "uint8" and int(np.frombuffer(msg.buffer, np.int64, count=1)[0]) != 256:
            raise PayloadError("wrong_size", f"tensor {k}: codebook size is not 256")
        try:
            t = _extract(msg, compression, numel).reshape(tuple(shape))
        except Exception as exc:
            raise PayloadError("bad_proto", f"tensor {k}: {exc}") from None
        if not torch.isfinite(t).all():
            raise PayloadError("not_finite", f"tensor {k} has NaN or inf")
        out.append(t)
    if off != len(payload):
        raise PayloadError("trailing_bytes", f"{len(payload) - off} bytes after the last tensor")
    return out


