"""encode_batch / decode_batch: RolloutBatch <-> header + zstd(msgpack map of flattened columns).

The body is columnar (all ids of the batch in one stream, all log-probs in another) so zstd sees long runs
of like data; docs/protocol.md gives every key, type and byte order.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from . import columns as col
from . import pids as pid_codec
from . import sharing
from .batch import Completion, DecodeLimits, Group, RolloutBatch
from .errors import ProtocolError
from .framing import frame, unframe
from .validate import check_counts, check_header_fields, check_int, check_rewards, check_str

ID_PACKED = 0  # palette indices bit-packed at bit_width(palette size)
ID_PLANES = 1  # palette indices as little-endian byte planes
LOGPROB_SCALE_BITS = 6  # step 1/64: |error| <= 1/128 = 0.0078125
MIN_SCALE_BITS, MAX_SCALE_BITS = 6, 16  # a decoder accepts any step at least this fine
ZSTD_LEVEL = 3  # large bodies
ZSTD_LEVEL_SMALL = 19  # bodies up to SMALL_BODY (a small model's round): at most ~70 ms, usually < 1 ms
SMALL_BODY = 64 << 10
LQ_ESCAPE = 255  # quantized log-probs >= this carry the rest in the escape column `lx`
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


def _reward_table(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rewards (by bit pattern, so -0.0 stays -0.0) in ascending bit order, and an index per reward."""
    bits = np.ascontiguousarray(rewards, dtype="<f8").view("<u8")
    table, index = np.unique(bits, return_inverse=True)
    return table, index.reshape(-1)


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
    empty = np.zeros(0, np.int64)
    all_tok = np.concatenate(tok) if tok else empty
    for a in (np.concatenate(prompts) if prompts else empty, all_tok):
        if a.size and (int(a.min()) < 0 or int(a.max()) >= vocab):
            raise ProtocolError("id_out_of_range", f"token ids must be in [0, {vocab})")
    all_lp = np.concatenate(lps) if lps else np.zeros(0)
    if not np.all(np.isfinite(all_lp)):
        raise ProtocolError("logprob_not_finite", "a log-prob is NaN or infinite")
    all_q = col.quantize_logprobs(all_lp, LOGPROB_SCALE_BITS)
    if all_q.size and int(all_q.min()) < 0:
        raise ProtocolError("logprob_positive", "a log-prob is > 1/128 (log-probs must be <= 0)")
    try:
        rewards = np.array([float(c.reward) for c in comps], dtype="<f8")
    except (TypeError, ValueError):
        raise ProtocolError("schema", "a reward is not a number") from None
    check_rewards(rewards)
    r_table, r_index = _reward_table(rewards)
    templates, t_index, numbers = pid_codec.encode_ids(pids)
    cut = np.cumsum(comp_lens)[:-1]
    keys = np.split((all_tok << 24) | all_q, cut) if comps else []  # id < 2**24 and q < 2**24: one int64 each
    d, shared = sharing.find_shared(keys, group_sizes)
    starts = np.cumsum(comp_lens) - comp_lens
    keep = np.ones(all_tok.size, dtype=bool)  # the tokens after each completion's shared prefix
    for st, sh in zip(starts[shared > 0].tolist(), shared[shared > 0].tolist(), strict=True):
        keep[st : st + sh] = False
    ids = np.concatenate([*prompts, all_tok[keep]]) if prompts or comps else empty
    q = all_q[keep]
    id_layout, ranked, palette, indices = build_palette(ids, id_layout)
    rw_width = col.packed_width(len(r_table))
    return {
        **strings,
        "round": round_,
        "vocab": vocab,
        "gn": len(groups),
        "pt": templates,
        "pti": list(col.to_planes(t_index)),
        "pn": list(col.to_planes(numbers)),
        "ng": list(col.to_planes(group_sizes)),
        "pl": list(col.to_planes(prompt_lens)),
        "cl": list(col.to_planes(comp_lens)),
        "cs": list(col.to_planes(shared * sharing.D_SPAN + d)),
        "rv": r_table.astype("<u8").tobytes(),
        "ri": [rw_width, col.pack_bits(r_index, rw_width)],
        "np": len(palette),
        "pd": 0 if ranked else 1,
        "pal": list(col.to_planes(palette if ranked else np.diff(palette, prepend=0))),
        "idl": id_layout,
        "idx": _encode_ids(indices.reshape(-1), len(palette), id_layout),
        "lps": LOGPROB_SCALE_BITS,
        "lq": list(col.to_planes(np.minimum(q, LQ_ESCAPE))),
        "lx": list(col.to_planes(q[q >= LQ_ESCAPE] - LQ_ESCAPE)),
    }


def encode_batch(batch: RolloutBatch, *, id_layout: int | None = None, level: int | None = None) -> bytes:
    """Serialize a batch; raises ProtocolError if it would not pass decode_batch with default limits.

    `id_layout` None picks ID_PLANES or ID_PACKED from the id statistics; `level` is the zstd level (None:
    ZSTD_LEVEL_SMALL for bodies up to SMALL_BODY bytes, where it costs well under a millisecond, else ZSTD_LEVEL).
    """
    body = pack_body(batch_to_body(batch, id_layout))
    if level is None:
        level = ZSTD_LEVEL_SMALL if len(body) <= SMALL_BODY else ZSTD_LEVEL
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


def _prompt_ids(obj: dict, n_groups: int, limits: DecodeLimits) -> list[str]:
    """The groups' prompt ids from the template table, the template index column and the number column."""
    templates = _field(obj, "pt", list)
    if len(templates) > n_groups or not all(isinstance(t, str) for t in templates):
        raise ProtocolError("schema", f"'pt' must be at most {n_groups} templates")
    n_holes = pid_codec.check_templates(templates, limits.max_string_bytes)
    index = _uints(obj, "pti", n_groups)
    if index.size and int(index.max()) >= len(templates):
        raise ProtocolError("schema", f"a prompt-id template index >= {len(templates)} templates")
    numbers = _uints(obj, "pn", int(n_holes[index].sum()) if index.size else 0)
    return [check_str(p, "prompt_id", limits) for p in pid_codec.decode_ids(templates, index, numbers)]


def _rewards(obj: dict, n_comps: int) -> np.ndarray:
    """float64 rewards from the table of distinct values (strictly ascending bit patterns) and the indices."""
    rv = _field(obj, "rv", bytes)
    if len(rv) % 8 or len(rv) // 8 > n_comps or (n_comps and not rv):
        raise ProtocolError("length_mismatch", f"'rv' has {len(rv)} bytes for {n_comps} rewards")
    bits = np.frombuffer(rv, dtype="<u8")
    if bits.size > 1 and not np.all(bits[1:] > bits[:-1]):
        raise ProtocolError("schema", "the reward table is not strictly ascending")
    table = bits.view("<f8")
    check_rewards(table)
    width, data = _pair(obj, "ri")
    if width != col.packed_width(len(table)):
        raise ProtocolError("schema", f"reward index width {width} != max(1, bit_width({len(table)}))")
    if len(data) != col.packed_size(width, n_comps):
        raise ProtocolError("length_mismatch", f"'ri' has {len(data)} bytes for {n_comps} x {width} bits")
    index = col.unpack_bits(data, width, n_comps).astype(np.int64)
    if index.size and int(index.max()) >= len(table):
        raise ProtocolError("schema", f"a reward index >= {len(table)} table entries")
    return table[index]


def body_to_batch(obj: Any, limits: DecodeLimits = _DEFAULT_LIMITS) -> RolloutBatch:
    """Check every field of a decoded msgpack map and rebuild the batch. Unknown keys are ignored.

    Counts are read in dependency order (groups, then completions, then tokens), and each column's byte
    length is checked against its count before it is decoded.
    """
    if not isinstance(obj, dict):
        raise ProtocolError("schema", f"body is {type(obj).__name__}, not a map")
    strings = {k: check_str(_field(obj, k, str), k, limits) for k in ("swarm", "task", "tok", "model")}
    round_, vocab = check_header_fields(_field(obj, "round", int), _field(obj, "vocab", int), limits)
    n_groups = check_int(_field(obj, "gn", int), "gn")
    if not 0 <= n_groups <= limits.max_groups:
        raise ProtocolError("too_many_groups", f"{n_groups} groups not in [0, {limits.max_groups}]")
    group_sizes = _uints(obj, "ng", n_groups)
    prompt_lens = _uints(obj, "pl", n_groups)
    pids = _prompt_ids(obj, n_groups, limits)
    n_comps = int(group_sizes.sum())
    if n_comps > limits.max_completions:
        raise ProtocolError("too_many_completions", f"{n_comps} completions > {limits.max_completions}")
    comp_lens = _uints(obj, "cl", n_comps)
    check_counts(group_sizes, prompt_lens, comp_lens, limits)
    cs = _uints(obj, "cs", n_comps)
    d, shared = cs % sharing.D_SPAN, cs // sharing.D_SPAN
    sharing.check_sources(d, shared, comp_lens, group_sizes)
    n_new = comp_lens - shared
    rewards = _rewards(obj, n_comps)
    n_prompt_tok, n_new_tok = int(prompt_lens.sum()), int(n_new.sum())
    palette_size = check_int(_field(obj, "np", int), "np")
    if not 0 <= palette_size <= min(vocab, n_prompt_tok + n_new_tok):
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
    ids = palette[_decode_ids(obj, layout, palette_size, n_prompt_tok + n_new_tok)]
    scale = check_int(_field(obj, "lps", int), "lps")
    if not MIN_SCALE_BITS <= scale <= MAX_SCALE_BITS:
        raise ProtocolError("schema", f"log-prob scale bits {scale} not in [{MIN_SCALE_BITS}, {MAX_SCALE_BITS}]")
    q = _uints(obj, "lq", n_new_tok)
    if q.size and int(q.max()) > LQ_ESCAPE:
        raise ProtocolError("schema", f"'lq' holds a value over {LQ_ESCAPE}")
    escaped = q == LQ_ESCAPE
    q[escaped] += _uints(obj, "lx", int(escaped.sum()))
    if q.size and int(q.max()) > col.Q_MAX:
        raise ProtocolError("schema", f"quantized log-prob over {col.Q_MAX}")
    comp_ids = ids[n_prompt_tok:]
    logprobs = col.dequantize_logprobs(q, scale)  # -q / 2**scale: finite and <= 0 by construction
    if shared.any():  # copy the shared prefixes (at most max_total_tokens in all, checked above)
        pos = sharing.expand(d, shared, comp_lens, n_new_tok)
        comp_ids, logprobs = comp_ids[pos], logprobs[pos]
    prompt_ids = np.split(ids[:n_prompt_tok], np.cumsum(prompt_lens)[:-1]) if n_groups else []
    cut = np.cumsum(comp_lens)[:-1]
    comp_ids = np.split(comp_ids, cut) if n_comps else []
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


# ------------------------------------------------------------------------------------------ wire form

COLUMN_KEYS = frozenset({"pti", "pn", "ng", "pl", "cl", "cs", "ri", "pal", "idx", "lq", "lx"})
WIRE_ORDER = ("swarm", "task", "tok", "model", "round", "vocab", "gn", "pt", "pti", "pn", "ng", "pl", "cl", "cs",
              "rv", "ri", "np", "pd", "pal", "idl", "idx", "lps", "lq", "lx")
TEMPLATE_END = pid_codec.END


def pack_body(body: dict) -> bytes:
    """The body map as what travels: one flat msgpack array of scalars and bins in WIRE_ORDER, each column
    as two slots (k, bin), the templates as one bin of utf-8 text; no keys. Keys not in WIRE_ORDER follow
    in order (a newer minor's optional fields; a decoder ignores slots it does not know)."""
    slots: list = []
    for key in WIRE_ORDER:
        value = body.get(key)
        if key in COLUMN_KEYS:
            slots += value if isinstance(value, list) and len(value) == 2 else [value, None]
        elif key == "pt" and isinstance(value, list) and all(isinstance(t, str) for t in value):
            try:
                slots.append("".join(t + TEMPLATE_END for t in value).encode(*pid_codec.ENCODING))
            except UnicodeEncodeError:
                raise ProtocolError("schema", "a prompt id is not valid unicode") from None
        else:
            slots.append(value)
    slots += [v for k, v in body.items() if k not in WIRE_ORDER]
    return msgpack.packb(slots, use_bin_type=True)


WIRE_SLOTS = len(WIRE_ORDER) + len(COLUMN_KEYS)


def wire_to_body(slots: Any) -> dict:
    """The flat array back into the body map body_to_batch checks (columns as [k, bin] again)."""
    if not isinstance(slots, list):
        raise ProtocolError("schema", f"body is {type(slots).__name__}, not an array")
    if len(slots) < WIRE_SLOTS:
        raise ProtocolError("schema", f"body has {len(slots)} slots, 2.0 needs {WIRE_SLOTS}")
    body, i = {}, 0
    for key in WIRE_ORDER:
        if key in COLUMN_KEYS:
            body[key] = [slots[i], slots[i + 1]]
            i += 2
        else:
            body[key] = slots[i]
            i += 1
    pt = body["pt"]
    if isinstance(pt, bytes):
        try:
            text = pt.decode(*pid_codec.ENCODING)
        except UnicodeDecodeError:
            raise ProtocolError("schema", "'pt' is not utf-8") from None
        if text and not text.endswith(TEMPLATE_END):
            raise ProtocolError("schema", "'pt' does not end a template")
        body["pt"] = text.split(TEMPLATE_END)[:-1]
    return body


class _TooDeep(Exception):
    """Raised from msgpack's hooks: an array inside an array, or any map (2.0 bodies have neither)."""


def _flat_list(items: list) -> list:
    if any(isinstance(x, (list, dict)) for x in items):
        raise _TooDeep("an array holds a container")
    return items


def _no_map(pairs: dict) -> dict:
    raise _TooDeep("a map in the body")


def unpack_body(body: bytes, limits: DecodeLimits = _DEFAULT_LIMITS) -> Any:
    """msgpack -> Python objects, never raising anything but ProtocolError.

    A 2.0 body is one flat array of scalars and bins, so the hooks refuse any nested container and any
    map the moment it is complete, and msgpack's length limits (from `limits.msgpack_limits()`) refuse any
    string, bin, array or map longer than a valid body has: a body of millions of nested empty arrays
    costs a few objects, not one Python list per byte.
    """
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True, list_hook=_flat_list,
                               object_hook=_no_map, **limits.msgpack_limits())
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
    return body_to_batch(wire_to_body(unpack_body(unframe(data, limits), limits)), limits)


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
