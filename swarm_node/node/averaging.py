"""Gossip averaging of trainable parameters: encode, validate, combine x_i <- sum_j W_ij x_j.

The same functions serve the in-process simulation (tests) and the networked node, so what the tests
measure is what runs. Payloads are hivemind-compressed protobuf tensors behind a small fixed header, never
pickles; a received payload is hostile until `decode_params` has checked its header, the per-tensor
compression, dtype, shape, byte length and finiteness. Optimizer state is never averaged.

Payload layout (little-endian):
    b"SNDP" | u8 version | 16 ascii bytes arch fingerprint | u32 tensor count |
    per tensor: u32 length | hivemind runtime_pb2.Tensor bytes
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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

from swarm_node.topology import mixing_matrix_from_adjacency

log = logging.getLogger(__name__)

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
    """A peer's parameter payload failed validation; `reason` is a short counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def trainable_named(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def arch_fingerprint(model: Any) -> str:
    """Hash of the names and shapes of the trainable parameters (16 hex chars).

    Two nodes can average only if this matches; with LoRA it covers the adapter names, rank and targets.
    """
    desc = ";".join(f"{n}:{tuple(p.shape)}" for n, p in trainable_named(model))
    return hashlib.sha256(desc.encode()).hexdigest()[:16]


def get_params(model: Any) -> list[torch.Tensor]:
    """Detached float32 CPU copies of the trainable parameters (bf16 is cast: hivemind refuses it)."""
    return [p.detach().to("cpu", torch.float32).clone() for _, p in trainable_named(model)]


@torch.no_grad()
def set_params(model: Any, tensors: Sequence[torch.Tensor]) -> None:
    params = trainable_named(model)
    if len(params) != len(tensors):
        raise ValueError(f"expected {len(params)} tensors, got {len(tensors)}")
    for (_, p), t in zip(params, tensors, strict=True):
        p.copy_(t.to(p.device, p.dtype))


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


@dataclass
class RejectCounter:
    """Counts (and logs) dropped payloads by reason, for metrics."""

    counts: Counter = field(default_factory=Counter)

    def drop(self, peer: str, err: PayloadError) -> None:
        self.counts[err.reason] += 1
        log.warning("dropped parameters from %s: %s", peer, err)


def live_mixing_row(
    adjacency: np.ndarray, ids: Sequence[str], self_id: str, missing: Iterable[str] = ()
) -> dict[str, float]:
    """Our row of the Metropolis-Hastings matrix of the live subgraph (the graph minus `missing` peers).

    When every node removes the same vertices (a peer that is gone for everyone: each of its neighbours
    misses it, and the others see its stale membership record), the rows form the MH matrix of the live
    subgraph: still symmetric and doubly stochastic, so the average is preserved. Until a node's view
    catches up, its row belongs to a nearby matrix; the next membership refresh rebuilds the graph.
    """
    idx = {p: i for i, p in enumerate(ids)}
    me = idx[self_id]
    live = np.asarray(adjacency, dtype=bool).copy()
    for p in set(missing) - {self_id}:
        if p in idx:
            live[idx[p], :] = live[:, idx[p]] = False
    w = mixing_matrix_from_adjacency(live)
    return {ids[j]: float(w[me, j]) for j in range(len(ids)) if w[me, j] > 0.0}


def combine(weights: dict[str, float], params: dict[str, Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """x <- sum_j w_j x_j, summed in sorted peer-id order so equal inputs give bit-identical results."""
    order = sorted(weights)
    total = sum(weights[p] for p in order)
    out = [torch.zeros_like(t) for t in params[order[0]]]
    for p in order:
        w = weights[p] / total
        for o, t in zip(out, params[p], strict=True):
            o.add_(t, alpha=w)
    return out


def consensus_distance(own: Sequence[torch.Tensor], others: Sequence[Sequence[torch.Tensor]]) -> float:
    """||x_i - mean_j x_j|| over the neighbours received (0.0 when none arrived)."""
    if not others:
        return 0.0
    sq = 0.0
    for k, t in enumerate(own):
        mean = torch.stack([o[k] for o in others]).mean(dim=0)
        sq += float(((t - mean) ** 2).sum())
    return sq ** 0.5


def params_digest(tensors: Sequence[torch.Tensor]) -> str:
    """sha256 (16 hex) of the float32 bytes: equal digests mean bit-identical parameters."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def params_probe(tensors: Sequence[torch.Tensor], k: int = 4) -> list[float]:
    """k fixed random projections (seed 0): nodes whose probes agree hold nearly the same parameters.

    Unlike a digest this tolerates compression error, so it compares nodes after an all-reduce.
    """
    g = torch.Generator().manual_seed(0)
    out = torch.zeros(k, dtype=torch.float64)
    for t in tensors:
        flat = t.detach().to("cpu", torch.float64).reshape(-1)
        out += torch.randn(k, flat.numel(), generator=g, dtype=torch.float64) @ flat
    return [float(v) for v in out]


def params_sq_distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return float(sum(((x - y) ** 2).sum() for x, y in zip(a, b, strict=True)))


@dataclass
class GossipResult:
    params: list[torch.Tensor]
    weights: dict[str, float]
    present: list[str]
    missing: list[str]
    consensus_distance: float



def _decode_received(
    peers: Sequence[str],
    received: dict[str, bytes | None],
    shapes: Sequence[torch.Size | tuple[int, ...]],
    arch_fp: str,
    compression: str,
    rejects: RejectCounter | None,
    max_bytes: int | None,
) -> dict[str, list[torch.Tensor]]:
    """Decode the payloads that arrived from `peers`; a bad one is dropped with a counted reason."""
    out: dict[str, list[torch.Tensor]] = {}
    for peer in peers:
        blob = received.get(peer)
        if blob is None:
            continue
        try:
            out[peer] = decode_params(blob, shapes, arch_fp, compression, max_bytes)
        except PayloadError as err:
            (rejects or RejectCounter()).drop(peer, err)
    return out

def gossip_step(
    self_id: str,
    own_payload: bytes,
    received: dict[str, bytes | None],
    ids: Sequence[str],
    adjacency: np.ndarray,
    shapes: Sequence[torch.Size | tuple[int, ...]],
    arch_fp: str,
    compression: str = "float16",
    rejects: RejectCounter | None = None,
    max_bytes: int | None = None,
    known_missing: Iterable[str] = (),
) -> GossipResult:
    """One gossip average for node `self_id`, from the bytes it published and the bytes it received.

    Our own contribution is decoded from the same bytes we sent, so every node averages identical numbers
    (federated mode ends bit-identical). Neighbours that sent nothing, or a payload that fails validation,
    count as missing and the row is re-weighted on the live subgraph (minus `known_missing` too: peers
    the membership shows gone, so that rows of nodes that are not its neighbours agree).
    """
    own = decode_params(own_payload, shapes, arch_fp, compression)
    idx = {p: i for i, p in enumerate(ids)}
    nbrs = [ids[j] for j in np.flatnonzero(np.asarray(adjacency)[idx[self_id]])]
    params = {self_id: own, **_decode_received(nbrs, received, shapes, arch_fp, compression, rejects, max_bytes)}
    present = [p for p in nbrs if p in params]
    missing = [p for p in nbrs if p not in params]
    weights = live_mixing_row(adjacency, ids, self_id, set(missing) | set(known_missing))
    dist = consensus_distance(own, [params[p] for p in present])
    return GossipResult(combine(weights, params), weights, present, missing, dist)


def federated_step(
    self_id: str,
    own_payload: bytes,
    received: dict[str, bytes | None],
    participants: Sequence[str],
    shapes: Sequence[torch.Size | tuple[int, ...]],
    arch_fp: str,
    compression: str = "float16",
    rejects: RejectCounter | None = None,
    max_bytes: int | None = None,
) -> GossipResult:
    """Exact (uniform) average of the participants' published parameters, self included if sampled.

    Every node decodes the same bytes and sums them in the same order, so all nodes that received every
    participant end the round with bit-identical parameters. A node outside the sample adopts the
    average; if no participant arrived it keeps its own parameters.
    """
    own = decode_params(own_payload, shapes, arch_fp, compression)
    others = [p for p in participants if p != self_id]
    decoded = {**_decode_received(others, received, shapes, arch_fp, compression, rejects, max_bytes), self_id: own}
    # participants' order, the same on every node: the sum is then bit-identical everywhere
    params = {p: decoded[p] for p in participants if p in decoded}
    present = [p for p in others if p in params]
    missing = [p for p in others if p not in params]
    if not params:
        return GossipResult(own, {self_id: 1.0}, [], missing, 0.0)
    weights = {p: 1.0 / len(params) for p in params}
    dist = consensus_distance(own, [params[p] for p in present])
    return GossipResult(combine(weights, params), weights, present, missing, dist)
