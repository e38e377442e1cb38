"""The fixed header around the zstd frame, and a decompression that refuses bombs before allocating.

Layout: b"SNRB" | major u8 | minor u8 | body length u32 little-endian | one zstd frame, compressed with
the version's dictionary (zdict.py) and without a dictionary id in its header.
"""

from __future__ import annotations

import struct
import threading

import zstandard

from .batch import DecodeLimits
from .errors import ProtocolError
from .zdict import dictionary

MAGIC = b"SNRB"
MAJOR = 2  # 2.0: prompt-id templates, a reward table, shared completion prefixes (docs/protocol.md)
MINOR = 0
HEADER = struct.Struct("<4sBBI")
HEADER_SIZE = HEADER.size  # 10
MAX_WINDOW = 1 << 27  # zstd's own default ceiling; refuse frames that ask a decoder for more
_BYTES_PER_BLOCK = 4096  # our encoder never emits blocks this small on average; bounds the block walk


_local = threading.local()  # (de)compressors are not thread-safe; one set per thread (intake decodes off the loop)


def compress_bound(size: int) -> int:
    """zstd's ZSTD_COMPRESSBOUND: the most bytes one zstd frame of a `size`-byte input can take."""
    small = ((128 << 10) - size) >> 11 if size < (128 << 10) else 0
    return size + (size >> 8) + small


def max_payload_bytes(limits: DecodeLimits) -> int:
    """The largest payload (header + frame) our encoder makes of any batch within `limits`: the zstd bound
    of the largest body they allow (`body_cap`), capped by `max_compressed_bytes`. A bigger payload is no
    batch a receiver with these limits would decode, so it need not be downloaded."""
    return min(limits.max_compressed_bytes, HEADER_SIZE + compress_bound(limits.body_cap()))


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """A cached compressor per level and thread: digesting the dictionary for level 19 costs ~15 ms."""
    cache = _local.__dict__.setdefault("compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, dict_data=dictionary(), write_content_size=True,
                                                write_checksum=False, write_dict_id=False)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "decompressor"):
        _local.decompressor = zstandard.ZstdDecompressor(dict_data=dictionary(), max_window_size=MAX_WINDOW)
    return _local.decompressor


def frame(body: bytes, level: int = 3) -> bytes:
    """Header + zstd frame of `body` (the frame records its content size, which decode requires)."""
    if len(body) > 0xFFFFFFFF:
        raise ProtocolError("decompressed_too_large", f"body of {len(body)} bytes does not fit a u32")
    return HEADER.pack(MAGIC, MAJOR, MINOR, len(body)) + _compressor(level).compress(body)


def _frame_end(data: bytes, start: int, declared: int) -> int:
    """Offset just past the zstd frame at `start`, walking block headers (RFC 8878 section 3.1.1.2)."""
    try:
        params = zstandard.get_frame_parameters(data[start : start + 18])
        pos = start + zstandard.frame_header_size(data[start : start + 18])
    except zstandard.ZstdError as exc:
        raise ProtocolError("bad_frame", f"zstd frame header: {exc}") from None
    if params.content_size != declared:
        raise ProtocolError(
            "bad_frame", f"zstd content size {params.content_size} != header length {declared}"
        )
    if params.window_size > MAX_WINDOW:
        raise ProtocolError("bad_frame", f"zstd window {params.window_size} over {MAX_WINDOW}")
    max_blocks = declared // _BYTES_PER_BLOCK + 64
    for _ in range(max_blocks):
        if pos + 3 > len(data):
            raise ProtocolError("truncated", "zstd block header cut off")
        head = int.from_bytes(data[pos : pos + 3], "little")
        last, kind, size = head & 1, (head >> 1) & 3, head >> 3
        if kind == 3:
            raise ProtocolError("bad_frame", "reserved zstd block type")
        pos += 3 + (1 if kind == 1 else size)
        if pos > len(data):
            raise ProtocolError("truncated", "zstd block cut off")
        if last:
            end = pos + (4 if params.has_checksum else 0)
            if end > len(data):
                raise ProtocolError("truncated", "zstd checksum cut off")
            return end
    raise ProtocolError("bad_frame", f"more than {max_blocks} zstd blocks")


def unframe(data: bytes, limits: DecodeLimits) -> bytes:
    """Check the header and size limits, then decompress into a buffer of exactly the declared size.

    The declared size must fit `limits.body_cap()`, derived from the token and group limits, so a
    receiver never inflates more than the largest batch it would accept could need.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError("schema", f"payload is {type(data).__name__}, not bytes")
    data = bytes(data)
    if len(data) > limits.max_compressed_bytes:
        raise ProtocolError("too_large", f"{len(data)} bytes > {limits.max_compressed_bytes}")
    if len(data) < HEADER_SIZE:
        raise ProtocolError("truncated", f"{len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, major, _minor, declared = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError("bad_magic", f"magic {magic!r} != {MAGIC!r}")
    if major != MAJOR:
        raise ProtocolError("version", f"major version {major}, this decoder knows {MAJOR}")
    cap = limits.body_cap()  # the largest body a batch within these limits needs, not a fixed 256 MiB
    if declared > cap:
        raise ProtocolError("decompressed_too_large", f"declares {declared} > {cap} (from the receive limits)")
    end = _frame_end(data, HEADER_SIZE, declared)
    if end != len(data):
        raise ProtocolError("trailing_data", f"{len(data) - end} bytes after the zstd frame")
    try:
        body = _decompressor().decompress(data[HEADER_SIZE:], max_output_size=declared)
    except zstandard.ZstdError as exc:
        raise ProtocolError("bad_frame", f"zstd: {exc}") from None
    if len(body) != declared:
        raise ProtocolError("bad_frame", f"decompressed {len(body)} bytes, header says {declared}")
    return body
