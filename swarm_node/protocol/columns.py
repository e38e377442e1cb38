"""Vectorized column codecs: bit-packing, byte planes and log-prob quantization (no per-token Python loops).

Byte planes (all low bytes, then all next bytes, ...) keep each byte position's statistics together so
zstd's entropy coder and match finder see them; bit-packing at a non-multiple of 8 bits hides them, so
it is only the better choice for near-uniform values (see docs/protocol.md for the measurements).
"""

from __future__ import annotations

import numpy as np

U32_MAX = (1 << 32) - 1
Q_MAX = (1 << 24) - 1  # quantized log-probs stay below 2**24 so -q / 2**s is exact in float32


def bit_width(n_values: int) -> int:
    """Bits needed to tell `n_values` values apart: ceil(log2(n)); 0 when there is at most one value."""
    return max(0, int(n_values - 1).bit_length())


def packed_width(n_values: int) -> int:
    """Width of bit-packed palette indices on the wire: bit_width, but at least 1, so that a count of
    indices is always backed by bytes (width 0 would let 2**23 tokens travel in zero bytes)."""
    return max(1, bit_width(n_values))


def pack_bits(values: np.ndarray, width: int) -> bytes:
    """Pack unsigned values (< 2**width, width <= 32) LSB-first into ceil(n*width/8) bytes.

    Value i occupies stream bits [i*width, (i+1)*width), value bit 0 first; stream bit k is bit (k % 8)
    of byte k // 8. The last byte is zero-padded.
    """
    if not 0 <= width <= 32:
        raise ValueError(f"width {width} not in 0..32")
    n = len(values)
    if width == 0 or n == 0:
        return b""
    le = np.ascontiguousarray(values, dtype="<u4").view(np.uint8).reshape(n, 4)
    bits = np.unpackbits(le, axis=1, bitorder="little")[:, :width]
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


def unpack_bits(data: bytes, width: int, count: int) -> np.ndarray:
    """Inverse of pack_bits; returns uint32. `data` must be exactly ceil(count*width/8) bytes."""
    if width == 0 or count == 0:
        return np.zeros(count, dtype=np.uint32)
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little", count=count * width)
    padded = np.zeros((count, 32), dtype=np.uint8)
    padded[:, :width] = bits.reshape(count, width)
    return np.packbits(padded, axis=1, bitorder="little").view("<u4").reshape(count).astype(np.uint32)


def packed_size(width: int, count: int) -> int:
    """Byte length of pack_bits output."""
    return (width * count + 7) // 8


def plane_count(values: np.ndarray) -> int:
    """Smallest number of byte planes (1..4) that holds every value (< 2**32); 0 only for no values.

    Even an all-zero column carries one plane: a decoder then sees at least one byte per value before it
    trusts a count (zstd makes the zero plane nearly free on the wire).
    """
    if len(values) == 0:
        return 0
    return max(1, (int(values.max()).bit_length() + 7) // 8)


def to_planes(values: np.ndarray, k: int | None = None) -> tuple[int, bytes]:
    """Split unsigned values (< 2**32) into k little-endian byte planes: plane j holds byte j of every value."""
    if k is None:
        k = plane_count(values)
    n = len(values)
    le = np.ascontiguousarray(values, dtype="<u4").view(np.uint8).reshape(n, 4)
    return k, np.ascontiguousarray(le[:, :k].T).tobytes()


def from_planes(data: bytes, k: int, count: int) -> np.ndarray:
    """Inverse of to_planes; returns uint32. `data` must be exactly k*count bytes, 0 <= k <= 4."""
    out = np.zeros((count, 4), dtype=np.uint8)
    if k and count:
        out[:, :k] = np.frombuffer(data, dtype=np.uint8).reshape(k, count).T
    return out.view("<u4").reshape(count).astype(np.uint32)


def quantize_logprobs(logprobs: np.ndarray, scale_bits: int) -> np.ndarray:
    """Map log-probs (<= 0) to q = round(-lp * 2**scale_bits), clamped to Q_MAX; returns int64 for checks.

    Dequantized -q / 2**scale_bits is within 2**-(scale_bits+1) of lp for lp >= -Q_MAX / 2**scale_bits
    (-262143.98 at scale 6). Lower values come back as that floor: float32 softmax cannot sample a token
    below about -104, so real batches never reach it.
    """
    q = np.rint(-np.asarray(logprobs, dtype=np.float64) * float(1 << scale_bits))
    return np.minimum(q, float(Q_MAX)).astype(np.int64)


def dequantize_logprobs(q: np.ndarray, scale_bits: int) -> np.ndarray:
    """-q / 2**scale_bits as float32; exact because q <= Q_MAX < 2**24 and the divisor is a power of two."""
    out = q.astype(np.float32)
    out *= np.float32(-1.0 / (1 << scale_bits))
    return out
