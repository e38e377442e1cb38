"""Structure-aware fuzzing of the DPO parameter payload codec and its receive path (swarm/averaging/payload.py, mixing.py).

Used by tests/test_fuzz.py and benchmarks/fuzz_params.py. Cases are valid payloads (random shapes, values and
compressions) with a header field, a tensor's length prefix or a field of a tensor's protobuf message
mutated; encoded payloads with their bytes damaged; random bytes (raw, behind a valid header, as a tensor
message); and bombs (huge counts, lengths and shapes). Each case is decoded against the receiver's own
shapes with `decode_params`; anything it raises other than PayloadError is a missed check, and an
accepted payload is checked against what the averaging relies on: one float32 tensor per expected shape,
all finite, from a payload within the size bound. A share of the cases also goes through the receive
path itself (`mixing.gossip_step` with the payload as a neighbour's), whose result must stay finite and
correctly shaped and count the neighbour missing exactly when the payload was refused.

Frames are taken apart and rebuilt from the layout docs/dpo.md documents ("Payloads"), not from the
codec's own structs: tests/test_fuzz.py checks that a real payload splits and rejoins to the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import torch
from hivemind.proto import runtime_pb2

from swarm_node.dpo import mixing
from swarm_node.swarm.averaging.payload import (
    COMPRESSIONS,
    MAGIC,
    VERSION,
    PayloadError,
    decode_params,
    encode_params,
)
from tooling.fuzzing import FuzzStats, pick, run_case

HEADER = struct.Struct("<4sB16sI")
"""b"SNDP" | u8 version | 16-byte architecture fingerprint | u32 tensor count (little-endian, docs/dpo.md)."""
LENGTH = struct.Struct("<I")
"""Per tensor: u32 length, then that many bytes of hivemind runtime_pb2.Tensor protobuf."""
ARCH = "fuzz-arch-000001"
EDGE_U32 = (0, 1, 2, 3, 255, 256, 65535, 65536, (1 << 31) - 1, 1 << 31, (1 << 32) - 1)
DTYPES = ("float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool", "", "float32\x00", "Float32", "object")
FAMILIES = ("field", "bytes", "random")


def random_shapes(rng: np.random.Generator) -> list[tuple[int, ...]]:
    """1-4 tensors of 0-3 dims (scalars included), at most 2048 elements each."""
    out = []
    for _ in range(int(rng.integers(1, 5))):
        nd = int(rng.integers(0, 4))
        dims = [int(rng.integers(1, 17)) for _ in range(nd)]
        while dims and int(np.prod(dims)) > 2048:
            dims[int(rng.integers(0, len(dims)))] = 1
        out.append(tuple(dims))
    return out


def random_tensors(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    scale = float(pick(rng, [1e-4, 0.02, 1.0, 300.0]))
    return [torch.from_numpy(np.asarray(rng.standard_normal(s) * scale, dtype=np.float32)).reshape(s) for s in shapes]


def split(payload: bytes) -> tuple[tuple, list[bytes]]:
    """A valid payload as (header fields, tensor messages)."""
    head = HEADER.unpack_from(payload, 0)
    off, msgs = HEADER.size, []
    for _ in range(head[3]):
        (n,) = LENGTH.unpack_from(payload, off)
        msgs.append(payload[off + LENGTH.size: off + LENGTH.size + n])
        off += LENGTH.size + n
    return head, msgs


def join(head: tuple, msgs: list[bytes], lengths: list[int] | None = None) -> bytes:
    parts = [HEADER.pack(*head)]
    for k, m in enumerate(msgs):
        parts.append(LENGTH.pack(len(m) if lengths is None else lengths[k]))
        parts.append(m)
    return b"".join(parts)


def _mutate_buffer(rng: np.random.Generator, buf: bytes, compression: str) -> tuple[bytes, str]:
    b = bytearray(buf)
    op = int(rng.integers(0, 7))
    if op == 0 and b:
        return bytes(b[: int(rng.integers(0, len(b)))]), "buffer_truncated"
    if op == 1:
        return bytes(b) + rng.bytes(int(rng.integers(1, 9))), "buffer_extended"
    if op == 2 and b:
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return bytes(b), "buffer_bytes"
    if op == 3:  # a NaN or inf where a value goes: no length check can catch it, only the finiteness one
        bad = float(pick(rng, [np.nan, np.inf, -np.inf]))
        if compression == "none" and len(b) >= 4:
            i = 4 * int(rng.integers(0, len(b) // 4))
            b[i: i + 4] = np.float32(bad).tobytes()
        elif compression == "float16" and len(b) >= 2:
            i = 2 * int(rng.integers(0, len(b) // 2))
            b[i: i + 2] = np.float16(bad).tobytes()
        elif compression == "uint8" and len(b) >= 8 + 1024:
            i = 8 + 4 * int(rng.integers(0, 256))  # a codebook entry: used if any index points at it
            b[i: i + 4] = np.float32(bad).tobytes()
            b[8 + 1024:] = bytes([(i - 8) // 4]) * (len(b) - 8 - 1024)
        return bytes(b), "buffer_not_finite"
    if op == 4 and compression == "uint8" and len(b) >= 8:
        b[0:8] = struct.pack("<q", int(pick(rng, [0, 1, 255, 257, -1, 1 << 40])))
        return bytes(b), "codebook_size"
    if op == 5:
        return b"", "buffer_empty"
    return rng.bytes(len(b)), "buffer_random"


def mutate_message(rng: np.random.Generator, raw: bytes, compression: str) -> tuple[bytes, str]:
    """One field of one hivemind Tensor message changed."""
    msg = runtime_pb2.Tensor()
    msg.ParseFromString(raw)
    op = int(rng.integers(0, 9))
    if op == 0:
        msg.compression = int(pick(rng, [0, 1, 2, 3, 4, 5, 6, 7]))
        what = f"compression={msg.compression}"
    elif op == 1:
        msg.dtype = str(pick(rng, DTYPES))
        what = f"dtype={msg.dtype!r}"
    elif op == 2:
        size = list(msg.size)
        sub = int(rng.integers(0, 6))
        if sub == 0 and size:
            size = size[::-1] if len(set(size)) > 1 else [*size, 1]
        elif sub == 1:
            size = [*size, 1]
        elif sub == 2 and size:
            size = size[:-1]
        elif sub == 3:
            size = [int(pick(rng, [0, (1 << 31) - 1, (1 << 32) - 1]))] + size[1:]  # uint32 on the wire
        elif sub == 4 and size:
            size[0] += 1
        else:
            size = [1] * int(rng.integers(0, 64))
        del msg.size[:]
        msg.size.extend(size)
        what = f"size={size[:6]}"
    elif op in (3, 4, 5):
        buf, what = _mutate_buffer(rng, msg.buffer, compression)
        msg.buffer = buf
    elif op == 6:
        msg.requires_grad = True
        what = "requires_grad"
    elif op == 7:
        msg.chunks = int(pick(rng, [0, 1, -1, (1 << 31) - 1, -(1 << 31)]))  # int32
        what = "chunks"
    else:  # an unknown field appended: protobuf keeps it, the decoder must not care
        return raw + bytes([0x78 + 8 * int(rng.integers(0, 8))]) + rng.bytes(int(rng.integers(1, 6))), "unknown_field"
    return msg.SerializeToString(), what


def mutate_structure(rng: np.random.Generator, payload: bytes, compression: str) -> tuple[bytes, str]:
    head, msgs = split(payload)
    magic, version, fp, count = head
    op = int(rng.integers(0, 10))
    if op == 0:
        return join((pick(rng, [b"SNDQ", b"\x00" * 4, rng.bytes(4)]), version, fp, count), msgs), "magic"
    if op == 1:
        return join((magic, int(rng.integers(0, 256)), fp, count), msgs), "version"
    if op == 2:
        return join((magic, version, rng.bytes(16), count), msgs), "arch_fp"
    if op == 3:
        return join((magic, version, fp, int(pick(rng, EDGE_U32))), msgs), "count"
    if op == 4:
        lengths = [len(m) for m in msgs]
        k = int(rng.integers(0, len(msgs)))
        lengths[k] = int(pick(rng, [0, max(lengths[k] - 1, 0), lengths[k] + 1, (1 << 32) - 1]))
        return join(head, msgs, lengths), f"length[{k}]={lengths[k]}"
    if op == 5 and len(msgs) > 1:
        i, j = (int(x) for x in rng.choice(len(msgs), 2, replace=False))
        msgs[i], msgs[j] = msgs[j], msgs[i]
        return join(head, msgs), "swapped"
    if op == 6:
        k = int(rng.integers(0, len(msgs)))
        return join((magic, version, fp, count), msgs[:k] + msgs[k + 1:]), "dropped"
    if op == 7:
        k = int(rng.integers(0, len(msgs)))
        return join((magic, version, fp, count + 1), msgs[: k + 1] + msgs[k:]), "duplicated"
    if op == 8:
        return payload + rng.bytes(int(rng.integers(1, 9))), "trailing"
    k = int(rng.integers(0, len(msgs)))
    msgs[k], what = mutate_message(rng, msgs[k], compression)
    return join(head, msgs), f"tensor[{k}]:{what}"


def mutate_bytes(rng: np.random.Generator, data: bytes) -> tuple[bytes, str]:
    b = bytearray(data)
    op = int(rng.integers(0, 4))
    if op == 0:
        return bytes(b[: int(rng.integers(0, len(b)))]), "truncated"
    if op == 1:
        i = int(rng.integers(0, len(b) + 1))
        return bytes(b[:i]) + rng.bytes(int(rng.integers(1, 17))) + bytes(b[i:]), "inserted"
    if op == 2:
        for _ in range(int(rng.integers(1, 6))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return bytes(b), "flipped"
    i, j = sorted(int(x) for x in rng.integers(0, len(b), 2))
    return bytes(b[:i]) + bytes(b[j:]), "spliced"


def bombs(shapes: list[tuple[int, ...]], compression: str, max_bytes: int) -> list[tuple[str, bytes]]:
    """Payloads that claim far more than they hold, or hold as much as the size bound allows."""
    fp = ARCH.encode()
    head = (MAGIC, VERSION, fp, len(shapes))
    huge_shape = runtime_pb2.Tensor(compression=COMPRESSIONS[compression].compression_type, dtype="float32",
                                    size=[(1 << 31) - 1, (1 << 31) - 1]).SerializeToString()
    many_dims = runtime_pb2.Tensor(compression=COMPRESSIONS[compression].compression_type, dtype="float32",
                                   size=[1] * 200_000).SerializeToString()
    filler = b"\x7a" + b"\xff" * 4 + b"\x0f"  # an unknown length-delimited field claiming ~4 GiB
    return [
        ("count_2**32-1", HEADER.pack(MAGIC, VERSION, fp, (1 << 32) - 1)),
        ("length_2**32-1", HEADER.pack(*head) + LENGTH.pack((1 << 32) - 1)),
        ("shape_2**62_elements", join(head, [huge_shape] * len(shapes))),
        ("200k_dims", join(head, [many_dims] * len(shapes))),
        ("unknown_field_4GiB", join(head, [filler] * len(shapes))),
        ("over_max_bytes", HEADER.pack(*head) + b"\x00" * (max_bytes + 1 - HEADER.size)),
        ("max_bytes_of_junk_message", join(head, [b"\x0a" + b"\x80" * 9 + b"\x01"] + [b"\x00" * (max_bytes // 2)])),
    ]


def check_invariants(out: list[torch.Tensor], shapes: list[tuple[int, ...]], payload: bytes,
                     max_bytes: int) -> list[str]:
    bad = []
    if len(payload) > max_bytes:
        bad.append(f"accepted {len(payload)} bytes > bound {max_bytes}")
    if len(out) != len(shapes):
        bad.append(f"{len(out)} tensors for {len(shapes)} shapes")
    for k, (t, s) in enumerate(zip(out, shapes, strict=False)):
        if not isinstance(t, torch.Tensor):
            bad.append(f"tensor {k} is a {type(t).__name__}")
            continue
        if tuple(t.shape) != tuple(s):
            bad.append(f"tensor {k}: shape {tuple(t.shape)} != {s}")
        if t.dtype != torch.float32:
            bad.append(f"tensor {k}: dtype {t.dtype}")
        if t.requires_grad:
            bad.append(f"tensor {k} requires grad")
        if not torch.isfinite(t).all():
            bad.append(f"tensor {k} not finite")
    return bad


def decode_case(stats: FuzzStats, family: str, name: str, data: bytes, shapes, compression: str, max_bytes: int,
                own: bytes | None = None) -> None:
    """Decode one case; with `own` (our payload), also run it through gossip_step as a neighbour's payload."""
    def receive(out) -> None:
        if own is not None:
            _receive_path(stats, family, name, data, shapes, compression, max_bytes, own, accepted=out is not None)

    run_case(stats, family, name, len(data), lambda: decode_params(data, shapes, ARCH, compression, max_bytes),
             refusals=(PayloadError,), check=lambda out: check_invariants(out, shapes, data, max_bytes), after=receive)


def _receive_path(stats, family, name, data, shapes, compression, max_bytes, own, accepted: bool) -> None:
    rejects = mixing.RejectCounter()
    adjacency = np.array([[0, 1], [1, 0]])
    try:
        res = mixing.gossip_step("me", own, {"peer": data}, ["me", "peer"], adjacency, shapes, ARCH, compression,
                                 rejects, max_bytes)
    except Exception as exc:
        stats.exceptions.append((f"receive:{family}:{name}", f"{type(exc).__name__}: {str(exc)[:200]}"))
        return
    bad = check_invariants(res.params, shapes, b"", max_bytes)
    if (res.present == ["peer"]) != accepted or (sum(rejects.counts.values()) == 0) != accepted:
        bad.append(f"present {res.present}, rejects {dict(rejects.counts)}, decoder accepted {accepted}")
    if bad:
        stats.violations.append((f"receive:{family}:{name}", bad))


def random_base(rng: np.random.Generator) -> tuple[list, str, bytes, bytes]:
    """(receiver's shapes, compression, a valid payload for them, the receiver's own payload)."""
    shapes = random_shapes(rng)
    compression = str(pick(rng, sorted(COMPRESSIONS)))
    return (shapes, compression, encode_params(random_tensors(rng, shapes), ARCH, compression),
            encode_params(random_tensors(rng, shapes), ARCH, compression))


def generate(rng: np.random.Generator, family: str, pool: list) -> Iterator[tuple[str, bytes, list, str, bytes]]:
    """Endless (name, payload, receiver's shapes, compression, receiver's own payload) of one family.

    Mutations start from a pool of valid payloads (encoding is the costly part, so one in ten cases
    replaces a pool entry with a fresh one).
    """
    while True:
        if rng.random() < 0.1:
            pool[int(rng.integers(0, len(pool)))] = random_base(rng)
        shapes, compression, valid, own = pool[int(rng.integers(0, len(pool)))]
        if family == "field":
            data, what = mutate_structure(rng, valid, compression)
        elif family == "bytes":
            data, what = mutate_bytes(rng, valid)
        else:
            raw = rng.bytes(int(rng.integers(0, 600)))
            j = int(rng.integers(0, 3))
            if j == 0:
                data, what = raw, "raw"
            elif j == 1:
                data, what = HEADER.pack(MAGIC, VERSION, ARCH.encode(), len(shapes)) + raw, "after_header"
            else:
                data, what = join((MAGIC, VERSION, ARCH.encode(), len(shapes)), [raw] * len(shapes)), "as_messages"
        yield what, data, shapes, compression, own


def run(n_cases: int, seed: int = 0, *, receive_share: float = 0.1, with_bombs: bool = True,
        max_bytes: int = 1 << 20, progress=None) -> dict[str, FuzzStats]:
    """n_cases mutations (plus unmutated payloads, 1 in 20, so the accepting path is checked too), then bombs."""
    rng = np.random.default_rng(seed)
    out = {f: FuzzStats() for f in (*FAMILIES, "valid", "bomb")}
    pool = [random_base(rng) for _ in range(64)]
    gens = {f: generate(rng, f, pool) for f in FAMILIES}
    for i in range(n_cases):
        through = rng.random() < receive_share
        if i % 20 == 0:
            shapes, compression, data, own = random_base(rng)
            decode_case(out["valid"], "valid", compression, data, shapes, compression, max_bytes, own if through else None)
        else:
            family = FAMILIES[int(rng.choice(3, p=(0.6, 0.25, 0.15)))]
            name, data, shapes, compression, own = next(gens[family])
            decode_case(out[family], family, name, data, shapes, compression, max_bytes, own if through else None)
        if progress is not None and (i + 1) % 10_000 == 0:
            progress(i + 1)
    if with_bombs:
        for compression in sorted(COMPRESSIONS):
            shapes = [(16, 16), (16,)]
            own = encode_params(random_tensors(rng, shapes), ARCH, compression)
            for name, data in bombs(shapes, compression, max_bytes):
                decode_case(out["bomb"], "bomb", f"{compression}:{name}", data, shapes, compression, max_bytes, own)
    return out

