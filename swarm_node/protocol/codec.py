"""encode_batch / decode_batch: RolloutBatch <-> header + zstd(msgpack map of flattened columns).

The body is columnar (all ids of the batch in one stream, all log-probs in another) so zstd sees long runs
of like data; docs/protocol.md gives every key, type and byte order.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from . import columns as col
from .batch import Completion, DecodeLimits, Group, RolloutBatch
from .errors import ProtocolError
from .framing import frame, unframe
from .validate import check_counts, check_header_fields, check_int, check_rewards, check_str

ID_PACKED = 0  # palette indices bit-packed at bit_width(palette size)
ID_PLANES = 1  # palette indices as little-endian byte planes
LOGPROB_SCALE_BITS = 6  # step 1/64: |error| <= 1/128 = 0.0078125
MIN_SCALE_BITS, MAX_SCALE_BITS = 6, 16  # a decoder accepts any step at least this fine
ZSTD_LEVEL = 3
_DEFAULT_LIMITS = DecodeLimits()


# ----------------------------------------------------------------------------------------------- encode


def _int_ids(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or (arr.size == 0 and arr.dtype == np.float64)):
        raise ProtocolError("schema", f"{name} must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64, copy=False)


def build_palette(ids: np.ndarray, id_layout: int | None) -> tuple[int, bool, np.ndarray, np.ndarray]:
    """(layout, ranked, palette, indices): distinct ids, value-sorted or by descending count.

    `id_layout` None picks one with choose_id_layout. Ranking gives frequent tokens small indices, so with more than 256 distinct ids the high byte planes
    of the index column are mostly zero and the low plane is skewed: zstd then codes Zipf-like text 2-3
    bits/token smaller. A value-sorted palette is cheaper to send (small deltas), so it is used otherwise.
    """
    values, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    layout = choose_id_layout(counts) if id_layout is None else id_layout
    if layout != ID_PLANES or len(values) <= 256:
        return layout, False, values, inverse
    order = np.argsort(-counts, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return layout, True, values[order], rank[inverse]


def choose_id_layout(counts: np.ndarray) -> int:
    """Planes when zstd's byte-wise entropy coder can beat the fixed width, else bit-packing.

    With <= 256 distinct ids one plane holds every index and Huffman gets within a fraction of a bit of
    the empirical entropy H; with more, planes pay off only when H is well below the packed width.
    """
    if len(counts) <= 256:
        return ID_PLANES
    p = counts / counts.sum()
    entropy = float(-(p * np.log2(p)).sum())
    return ID_PLANES if entropy < col.bit_width(len(counts)) - 1.0 else ID_PACKED


def _encode_ids(indices: np.ndarray, palette_size: int, layout: int) -> list[Any]:
    if layout == ID_PACKED:
        width = col.packed_width(palette_size)
        return [width, col.pack_bits(indices, width)]
    k, data = col.to_planes(indices)
    return [k, data]


def batch_to_body(batch: RolloutBatch, id_layout: int | None = None, limits: DecodeLimits = _DEFAULT_LIMITS) -> dict:
    """Validate `batch` against the same rules a decoder applies, and flatten it into the msgpack map."""
    strings = {
        k: check_str(getattr(batch, a), a, limits)
        for k, a in (("swarm", "swarm_id"), ("task", "task_id"), ("tok", "tokenizer_fp"), ("model", "model_name"))
    }
    round_, vocab = check_header_fields(batch.round, batch.vocab_size, limits)
    groups = list(batch.groups)
    pids = [check_str(g.prompt_id, "prompt_id", limits) for g in groups]
    prompts = [_int_ids(g.prompt_ids, "prompt_ids") for g in groups]
    comps = [c for g in groups for c in g.completions]
    tok = [_int_ids(c.token_ids, "token_ids") for c in comps]
    lps = [np.asarray(c.logprobs, dtype=np.float64).reshape(-1) for c in comps]
    group_sizes = np.array([len(g.completions) for g in groups], dtype=np.int64)
    prompt_lens = np.array([len(p) for p in prompts], dtype=np.int64)
    comp_lens = np.array([len(t) for t in tok], dtype=np.int64)
    if any(len(lp) != len(t) for lp, t in zip(lps, tok, strict=True)):
        raise ProtocolError("length_mismatch", "a completion has len(logprobs) != len(token_ids)")
    check_counts(group_sizes, prompt_lens, comp_lens, limits)
    ids = np.concatenate(prompts + tok) if prompts or tok else np.zeros(0, np.int64)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ProtocolError("id_out_of_range", f"token ids must be in [0, {vocab})")
    logprobs = np.concatenate(lps) if lps else np.zeros(0)
    if not np.all(np.isfinite(logprobs)):
        raise ProtocolError("logprob_not_finite", "a log-prob is NaN or infinite")
    q = col.quantize_logprobs(logprobs, LOGPROB_SCALE_BITS)
    if q.size and int(q.min()) < 0:
        raise ProtocolError("logprob_positive", "a log-prob is > 1/128 (log-probs must be <= 0)")
    try:
        rewards = np.array([float(c.reward) for c in comps], dtype="<f8")
    except (TypeError, ValueError):
        raise ProtocolError("schema", "a reward is not a number") from None
    check_rewards(rewards)
    id_layout, ranked, palette, indices = build_palette(ids, id_layout)
    return {
        **strings,
        "round": round_,
        "vocab": vocab,
        "pid": pids,
        "ng": list(col.to_planes(group_sizes)),
        "pl": list(col.to_planes(prompt_lens)),
        "cl": list(col.to_planes(comp_lens)),
        "rw": rewards.tobytes(),
        "np": len(palette),
        "pd": 0 if ranked else 1,
        "pal": list(col.to_planes(palette if ranked else np.diff(palette, prepend=0))),
        "idl": id_layout,
        "idx": _encode_ids(indices.reshape(-1), len(palette), id_layout),
        "lps": LOGPROB_SCALE_BITS,
        "lq": list(col.to_planes(q)),
    }


def encode_batch(batch: RolloutBatch, *, id_layout: int | None = None, level: int = ZSTD_LEVEL) -> bytes:
    """Serialize a batch; raises ProtocolError if it would not pass decode_batch with default limits.

    `id_layout` None picks ID_PLANES or ID_PACKED from the id statistics; `level` is the zstd level.
    """
    body = msgpack.packb(batch_to_body(batch, id_layout), use_bin_type=True)
    return frame(body, level)


# ----------------------------------------------------------------------------------------------- decode


def _field(obj: dict, key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise ProtocolError("schema", f"missing key {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ProtocolError("schema", f"{key!r} is {type(value).__name__}")
    return value


def _pair(obj: dict, key: str) -> tuple[int, bytes]:
    value = _field(obj, key, list)
    if len(value) != 2 or isinstance(value[0], bool) or not isinstance(value[0], int):
        raise ProtocolError("schema", f"{key!r} must be [int, bin]")
    if not isinstance(value[1], bytes):
        raise ProtocolError("schema", f"{key!r} must be [int, bin]")
    return value[0], value[1]


def _uints(obj: dict, key: str, count: int) -> np.ndarray:
    """A byte-plane column of `count` values; its bytes are checked before anything is allocated.

    A column of count > 0 must carry at least one plane: `count` comes from other fields, and without
    this a few hundred bytes could make the decoder allocate arrays for 2**26 values that were never sent.
    """
    k, data = _pair(obj, key)
    if not 0 <= k <= 4:
        raise ProtocolError("schema", f"{key!r} has {k} byte planes, not 0..4")
    if count and not k:
        raise ProtocolError("missing_planes", f"{key!r} has no byte planes for {count} values")
    if len(data) != k * count:
        raise ProtocolError("length_mismatch", f"{key!r} has {len(data)} bytes, expected {k} x {count}")
    return col.from_planes(data, k, count).astype(np.int64)


def _decode_ids(obj: dict, layout: int, palette_size: int, count: int) -> np.ndarray:
    if layout == ID_PACKED:
        width, data = _pair(obj, "idx")
        if count and not width:
            raise ProtocolError("missing_planes", f"'idx' is bit-packed at width 0 for {count} indices")
        if width != col.packed_width(palette_size):
            raise ProtocolError("schema", f"id width {width} != max(1, bit_width({palette_size}))")
        if len(data) != col.packed_size(width, count):
            raise ProtocolError("length_mismatch", f"'idx' has {len(data)} bytes for {count} x {width} bits")
        indices = col.unpack_bits(data, width, count).astype(np.int64)
    elif layout == ID_PLANES:
        indices = _uints(obj, "idx", count)
    else:
        raise ProtocolError("schema", f"unknown id layout {layout}")
    if indices.size and int(indices.max()) >= palette_size:
        raise ProtocolError("id_out_of_range", f"palette index >= palette size {palette_size}")
    return indices


def body_to_batch(obj: Any, limits: DecodeLimits = _DEFAULT_LIMITS) -> RolloutBatch:
    """Check every field of a decoded msgpack map and rebuild the batch. Unknown keys are ignored."""
    if not isinstance(obj, dict):
        raise ProtocolError("schema", f"body is {type(obj).__name__}, not a map")
    strings = {k: check_str(_field(obj, k, str), k, limits) for k in ("swarm", "task", "tok", "model")}
    round_, vocab = check_header_fields(_field(obj, "round", int), _field(obj, "vocab", int), limits)
    pids = _field(obj, "pid", list)
    if len(pids) > limits.max_groups:
        raise ProtocolError("too_many_groups", f"{len(pids)} groups > {limits.max_groups}")
    pids = [check_str(p, "prompt_id", limits) for p in pids]
    n_groups = len(pids)
    group_sizes = _uints(obj, "ng", n_groups)
    prompt_lens = _uints(obj, "pl", n_groups)
    n_comps = int(group_sizes.sum())
    if n_comps > limits.max_completions:
        raise ProtocolError("too_many_completions", f"{n_comps} completions > {limits.max_completions}")
    comp_lens = _uints(obj, "cl", n_comps)
    check_counts(group_sizes, prompt_lens, comp_lens, limits)
    rw = _field(obj, "rw", bytes)
    if len(rw) != 8 * n_comps:
        raise ProtocolError("length_mismatch", f"'rw' has {len(rw)} bytes for {n_comps} rewards")
    rewards = np.frombuffer(rw, dtype="<f8")
    check_rewards(rewards)
    n_prompt_tok, n_comp_tok = int(prompt_lens.sum()), int(comp_lens.sum())
    palette_size = check_int(_field(obj, "np", int), "np")
    if not 0 <= palette_size <= min(vocab, n_prompt_tok + n_comp_tok):
        raise ProtocolError("schema", f"palette size {palette_size} not in [0, min(vocab, tokens)]")
    palette_deltas = check_int(_field(obj, "pd", int), "pd")
    if palette_deltas not in (0, 1):
        raise ProtocolError("schema", f"'pd' is {palette_deltas}, not 0 or 1")
    palette = _uints(obj, "pal", palette_size)
    if palette_deltas:
        palette = np.cumsum(palette)  # < 2**32 * 2**24 entries: no int64 overflow
    if palette.size and int(palette.max()) >= vocab:
        raise ProtocolError("id_out_of_range", f"token id {int(palette.max())} >= vocab_size {vocab}")
    layout = check_int(_field(obj, "idl", int), "idl")
    ids = palette[_decode_ids(obj, layout, palette_size, n_prompt_tok + n_comp_tok)]
    scale = check_int(_field(obj, "lps", int), "lps")
    if not MIN_SCALE_BITS <= scale <= MAX_SCALE_BITS:
        raise ProtocolError("schema", f"log-prob scale bits {scale} not in [{MIN_SCALE_BITS}, {MAX_SCALE_BITS}]")
    q = _uints(obj, "lq", n_comp_tok)
    if q.size and int(q.max()) > col.Q_MAX:
        raise ProtocolError("schema", f"quantized log-prob over {col.Q_MAX}")
    logprobs = col.dequantize_logprobs(q, scale)  # -q / 2**scale: finite and <= 0 by construction
    prompt_ids = np.split(ids[:n_prompt_tok], np.cumsum(prompt_lens)[:-1]) if n_groups else []
    cut = np.cumsum(comp_lens)[:-1]
    comp_ids = np.split(ids[n_prompt_tok:], cut) if n_comps else []
    comp_lps = np.split(logprobs, cut) if n_comps else []
    groups, i = [], 0
    for pid, prompt, size in zip(pids, prompt_ids, group_sizes.tolist(), strict=True):
        cs = [Completion(comp_ids[j], comp_lps[j], float(rewards[j])) for j in range(i, i + size)]
        groups.append(Group(pid, prompt, cs))
        i += size
    return RolloutBatch(
        swarm_id=strings["swarm"],
        task_id=strings["task"],
        tokenizer_fp=strings["tok"],
        model_name=strings["model"],
        round=round_,
        vocab_size=vocab,
        groups=groups,
    )


class _TooDeep(Exception):
    """Raised from msgpack's hooks: a container inside a list, or a map inside a map."""


def _flat_list(items: list) -> list:
    if any(isinstance(x, (list, dict)) for x in items):
        raise _TooDeep("a list holds a container")
    return items


def _flat_map(pairs: dict) -> dict:
    if any(isinstance(v, dict) for v in pairs.values()):
        raise _TooDeep("a map holds a map")
    return pairs


def unpack_body(body: bytes, limits: DecodeLimits = _DEFAULT_LIMITS) -> Any:
    """msgpack -> Python objects, never raising anything but ProtocolError (str keys only).

    The body's shape is a map of scalars, bins and lists of scalars, so the hooks refuse any deeper
    nesting the moment the first nested container is complete, and msgpack's length limits (from
    `limits.msgpack_limits()`) refuse any string, bin, array or map longer than a valid body has: a body
    of millions of nested empty arrays costs a few objects, not one Python list per byte.
    """
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True, list_hook=_flat_list,
                               object_hook=_flat_map, **limits.msgpack_limits())
    except _TooDeep as exc:
        raise ProtocolError("msgpack_limit", str(exc)) from None
    except ValueError as exc:
        if "exceeds max_" in str(exc):  # msgpack's own length-limit message
            raise ProtocolError("msgpack_limit", str(exc)) from None
        raise ProtocolError("msgpack", f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # msgpack raises ExtraData, FormatError, StackError, TypeError...
        raise ProtocolError("msgpack", f"{type(exc).__name__}: {exc}") from None


def decode_batch_strict(data: bytes, limits: DecodeLimits = _DEFAULT_LIMITS) -> RolloutBatch:
    """decode_batch without its safety net: any exception other than ProtocolError is a bug here.

    Tests and the fuzzer call this one, so a missed check shows up as the exception it really is.
    """
    return body_to_batch(unpack_body(unframe(data, limits), limits), limits)


def decode_batch(data: bytes, limits: DecodeLimits = _DEFAULT_LIMITS) -> RolloutBatch:
    """Parse and fully validate a peer's payload; any defect raises ProtocolError with a short reason.

    Work is bounded by the limits: the body by `limits.body_cap()`, every array by the counts that the
    small columns declare and that the bytes present back up; all per-token work is vectorized numpy.
    """
    try:
        return decode_batch_strict(data, limits)
    except ProtocolError:
        raise
    except Exception as exc:  # defence in depth: a node never crashes on a peer's bytes; reason `internal`
        raise ProtocolError("internal", f"unexpected {type(exc).__name__}: {exc}") from None
