"""Structure-aware fuzzing of the rollout-batch decoder (tests/test_fuzz.py, benchmarks/fuzz_decode.py).

Cases are valid batches with their body mutated field by field, encoded payloads with their bytes
mutated, bombs (zstd of zeros, nested empty arrays, empty-plane columns, copied prefixes) and random
bytes. Each case is decoded with `decode_batch_strict`, so a missed check surfaces as the exception it
raises rather than the `internal` safety net; an accepted batch is checked against the invariants
docs/protocol.md promises (`check_invariants`). The frames are built with the codec's public pieces
(`batch_to_body`, `pack_body`, `frame`, the header struct of docs/protocol.md); no torch, no network.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import zstandard

from swarm_node.protocol import columns as col
from swarm_node.protocol import pids as pid_codec
from swarm_node.protocol.batch import Completion, DecodeLimits, Group, RolloutBatch
from swarm_node.protocol.codec import (
    ID_PACKED,
    ID_PLANES,
    batch_to_body,
    decode_batch_strict,
    encode_batch,
    pack_body,
)
from swarm_node.protocol.errors import ProtocolError
from swarm_node.protocol.framing import HEADER, MAGIC, MAJOR, MINOR, frame
from tooling.fuzzing import EDGE_INTS, INT64_MAX, FuzzStats, pick, random_object, random_text, run_case

VOCABS = (2, 3, 50, 256, 257, 1000, 151_936, 1 << 24)
COLUMNS = ("pti", "pn", "ng", "pl", "cl", "cs", "ri", "pal", "idx", "lq", "lx")
INT_KEYS = ("round", "vocab", "gn", "np", "pd", "idl", "lps")
STR_KEYS = ("swarm", "task", "tok", "model")

# ---------------------------------------------------------------------------------------- generation


def random_batch(rng: np.random.Generator) -> RolloutBatch:
    """A small valid batch; vocab, palette size and id statistics vary so every layout is exercised."""
    vocab = int(pick(rng, VOCABS))
    spread = int(pick(rng, [1, 4, 300, vocab]))  # distinct ids: one, few, over 256, anything
    base = int(rng.integers(0, max(1, vocab - spread + 1)))

    def ids(n: int) -> np.ndarray:
        return (base + rng.integers(0, min(spread, vocab), n)).astype(np.int64)

    groups = []
    for gi in range(int(rng.integers(0, 5))):
        comps = []
        for _ in range(int(rng.integers(0, 5))):
            n = int(rng.integers(0, 40))
            lps = -rng.exponential(float(pick(rng, [0.0, 0.01, 1.0, 30.0])), n).astype(np.float32)
            tok = ids(n)
            if comps and rng.random() < 0.4:  # repeats and shared prefixes, as sampled groups have them
                src = comps[int(rng.integers(0, len(comps)))]
                k = int(rng.integers(0, len(src.token_ids) + 1))
                tok = np.concatenate([src.token_ids[:k], tok[k:]]).astype(np.int64)
                lps = np.concatenate([src.logprobs[:k], lps[k:]])[: len(tok)].astype(np.float32)
                lps = np.concatenate([lps, np.zeros(len(tok) - len(lps), np.float32)])
            comps.append(Completion(tok, lps, float(pick(rng, [0.0, 1.0, -0.5, -0.0, 1e30, float(rng.normal())]))))
        pid = f"p{gi}:{random_text(rng, 6)}" if rng.random() < 0.5 else f"t:{gi}:{int(rng.integers(0, 10**10))}-0{gi}"
        groups.append(Group(pid, ids(int(rng.integers(0, 12))), comps))
    return RolloutBatch(random_text(rng), random_text(rng), random_text(rng, 40), random_text(rng),
                        int(pick(rng, [0, 1, 7, INT64_MAX])), vocab, groups)


# ----------------------------------------------------------------------------------------- mutations


def _mutate_bin(rng: np.random.Generator, data: bytes) -> bytes:
    b = bytearray(data)
    op = int(rng.integers(0, 6))
    if op == 0 and b:
        del b[int(rng.integers(0, len(b))):]
    elif op == 1:
        b += rng.bytes(int(rng.integers(1, 9)))
    elif op == 2 and b:
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
    elif op == 3:
        b = bytearray(b"\xff" * len(b))
    elif op == 4:
        b = bytearray(len(b))
    else:
        b = bytearray(rng.bytes(len(b)))
    return bytes(b)


def _mutate_column(rng: np.random.Generator, value: Any) -> Any:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], bytes)):
        return random_object(rng)
    k, data = value
    op = int(rng.integers(0, 6))
    if op == 5:
        return [k, pick(rng, ["ab", 5, None, [1], 1.5, True])]  # the bin part is not bytes
    if op == 0:
        return [int(pick(rng, [0, 1, 2, 3, 4, 5, -1, 1 << 40])), data]  # plane count disagrees with the bytes
    if op == 1:
        return [k, _mutate_bin(rng, data)]
    if op == 2:
        return [0, b""]  # no planes: the count must not be trusted
    if op == 3 and isinstance(k, int) and 0 < k <= 4:
        count = len(data) // k  # same count, values pushed to extremes
        return list(col.to_planes(np.full(count, int(pick(rng, [0, 1, 255, (1 << (8 * k)) - 1]))), k))
    return [k, data, random_object(rng)]


def mutate_body(rng: np.random.Generator, body: dict) -> tuple[dict, str]:
    """One to three field-level mutations of a valid body; returns (body, short description)."""
    body = dict(body)
    ops = []
    for _ in range(int(rng.integers(1, 4))):
        key = str(rng.choice(sorted(body))) if body else "round"
        op = int(rng.integers(0, 9))
        if op == 0:
            body.pop(key, None)
            ops.append(f"drop:{key}")
        elif op == 1:
            body[key] = random_object(rng)
            ops.append(f"replace:{key}")
        elif op == 2:
            v = int(pick(rng, EDGE_INTS)) + int(rng.integers(-1, 2))
            body[str(pick(rng, INT_KEYS))] = min(max(v, -(1 << 63)), (1 << 64) - 1)  # msgpack's int range
            ops.append("int")
        elif op == 3:
            c = str(pick(rng, COLUMNS))
            body[c] = _mutate_column(rng, body.get(c))
            ops.append(f"column:{c}")
        elif op == 4:
            body[str(pick(rng, STR_KEYS))] = pick(rng, ["", "x" * 513, "é" * 300, 5, None])
            ops.append("string")
        elif op == 5:
            pt = body.get("pt")
            if isinstance(pt, list):
                j = int(rng.integers(0, 4))
                extra = random_text(rng) + pid_codec.HOLE * int(rng.integers(0, 10))
                body["pt"] = (pt[1:] if j == 0 else pt + [extra] if j == 1 else pt + pt if j == 2
                              else [t.replace(pid_codec.HOLE, pick(rng, ["", pid_codec.END, "\udfff"]))
                                    if isinstance(t, str) else t for t in pt])  # an earlier op may have put a non-str
            ops.append("pt")
        elif op == 6:
            rv = body.get("rv")
            if isinstance(rv, bytes) and len(rv) % 8 == 0:
                arr = np.frombuffer(rv, "<f8").copy()
                if arr.size and rng.integers(0, 2):
                    arr[int(rng.integers(0, arr.size))] = pick(rng, [np.nan, np.inf, -np.inf, 1e308, -0.0])
                    body["rv"] = arr.tobytes()
                else:
                    body["rv"] = _mutate_bin(rng, rv)
            ops.append("rv")
        elif op == 7:
            a, b = (str(x) for x in rng.choice(COLUMNS, 2, replace=False))
            body[a], body[b] = body.get(b), body.get(a)
            ops.append(f"swap:{a}/{b}")
        else:
            body[f"x{int(rng.integers(0, 1000))}"] = random_object(rng)
            ops.append("unknown_key")
    return body, "+".join(ops)


def mutate_bytes(rng: np.random.Generator, data: bytes) -> tuple[bytes, str]:
    """Byte-level damage to an encoded payload: flips, cuts, insertions, header fields."""
    b = bytearray(data)
    op = int(rng.integers(0, 5))
    if op == 0:
        for _ in range(int(rng.integers(1, 5))):
            b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        return bytes(b), "flip"
    if op == 1:
        return bytes(b[: int(rng.integers(0, len(b)))]), "cut"
    if op == 2:
        at = int(rng.integers(0, len(b) + 1))
        return bytes(b[:at] + rng.bytes(int(rng.integers(1, 16))) + b[at:]), "insert"
    if op == 3:
        struct.pack_into("<I", b, 6, int(pick(rng, [0, 1, len(b), (1 << 32) - 1, int(rng.integers(0, 1 << 20))])))
        return bytes(b), "header_len"
    b[4], b[5] = int(pick(rng, [0, 1, 2, 255])), int(rng.integers(0, 256))
    return bytes(b), "header_version"


# ------------------------------------------------------------------------------------------- bombs


def zeros_bomb(declared: int) -> bytes:
    """A frame declaring `declared` bytes of zeros: a few KiB on the wire."""
    cobj = zstandard.ZstdCompressor(level=1, write_content_size=True).compressobj(size=declared)
    chunk, parts, left = bytes(1 << 20), [], declared
    while left:
        parts.append(cobj.compress(chunk[: min(left, len(chunk))]))
        left -= min(left, len(chunk))
    return HEADER.pack(MAGIC, MAJOR, MINOR, declared) + b"".join(parts) + cobj.flush()


def nested_arrays_bomb(n: int, deep: bool = False) -> bytes:
    """msgpack of n empty arrays inside one array (or n arrays nested in each other), zstd-framed."""
    body = (b"\x91" * n + b"\x90") if deep else (b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n)
    return frame(body, level=1)


def empty_planes_bomb(n_groups: int = 64, per_group: int = 1024, tokens: int = 128) -> bytes:
    """Counts taken from small columns, token columns without a single plane (accepted before 1.1)."""
    g, c = n_groups, n_groups * per_group
    body = {
        "swarm": "s", "task": "t", "tok": "f", "model": "m", "round": 0, "vocab": 2, "gn": g, "pt": ["q" + pid_codec.HOLE],
        "pti": list(col.to_planes(np.zeros(g))), "pn": list(col.to_planes(np.arange(g))),
        "ng": list(col.to_planes(np.full(g, per_group))), "pl": list(col.to_planes(np.zeros(g))),
        "cl": list(col.to_planes(np.full(c, tokens))), "cs": list(col.to_planes(np.zeros(c))), "rv": bytes(8),
        "ri": [1, bytes((c + 7) // 8)], "np": 1, "pd": 1, "pal": [0, b""], "idl": ID_PACKED, "idx": [0, b""], "lps": 6,
        "lq": [0, b""], "lx": [0, b""],
    }
    return frame(pack_body(body), level=19)


def shared_prefix_bomb(n_groups: int = 8, per_group: int = 16, tokens: int = 65536) -> bytes:
    """One real completion per group and every other one a copy of it: few bytes on the wire for
    n_groups * per_group * tokens tokens, which max_total_tokens must bound before anything is expanded."""
    g, c = n_groups, n_groups * per_group
    first = np.arange(c) % per_group == 0
    return frame(pack_body({
        "swarm": "s", "task": "t", "tok": "f", "model": "m", "round": 0, "vocab": 2, "gn": g, "pt": ["q"],
        "pti": list(col.to_planes(np.zeros(g))), "pn": [0, b""], "ng": list(col.to_planes(np.full(g, per_group))),
        "pl": list(col.to_planes(np.zeros(g))), "cl": list(col.to_planes(np.full(c, tokens))),
        "cs": list(col.to_planes(np.where(first, 0, tokens * 16 + 1))), "rv": bytes(8),
        "ri": [1, bytes((c + 7) // 8)], "np": 1, "pd": 1, "pal": [1, b"\0"], "idl": ID_PLANES,
        "idx": [1, bytes(g * tokens)], "lps": 6, "lq": [1, bytes(g * tokens)], "lx": [0, b""],
    }), level=19)


def bombs() -> list[tuple[str, bytes]]:
    return [
        ("zeros_256MiB", zeros_bomb(256 << 20)),
        ("zeros_16MiB", zeros_bomb(16 << 20)),
        ("nested_empty_arrays_16M", nested_arrays_bomb(16 << 20)),
        ("deep_arrays_100k", nested_arrays_bomb(100_000, deep=True)),
        ("empty_planes_2^23_tokens", empty_planes_bomb()),
        ("empty_planes_2^26_tokens", empty_planes_bomb(per_group=1024, tokens=1024)),
        ("shared_prefix_2^23_tokens", shared_prefix_bomb()),
    ]


# -------------------------------------------------------------------------------------- invariants


def check_invariants(batch: RolloutBatch, limits: DecodeLimits) -> list[str]:
    """What docs/protocol.md promises about any batch decode_batch returns; [] when all hold."""
    bad: list[str] = []
    for name in ("swarm_id", "task_id", "tokenizer_fp", "model_name"):
        v = getattr(batch, name)
        if not isinstance(v, str) or len(v.encode("utf-8")) > limits.max_string_bytes:
            bad.append(f"{name} not a short str")
    if not (isinstance(batch.round, int) and 0 <= batch.round <= INT64_MAX):
        bad.append("round out of range")
    if not (isinstance(batch.vocab_size, int) and 2 <= batch.vocab_size <= limits.max_vocab_size):
        bad.append("vocab out of range")
    if len(batch.groups) > limits.max_groups:
        bad.append("too many groups")
    n_comp, total = 0, 0
    for g in batch.groups:
        if not isinstance(g.prompt_id, str) or len(g.prompt_id.encode("utf-8")) > limits.max_string_bytes:
            bad.append("prompt id")
        arrays = [("prompt", g.prompt_ids, None, limits.max_prompt_tokens)]
        if len(g.completions) > limits.max_completions_per_group:
            bad.append("group too large")
        for c in g.completions:
            n_comp += 1
            arrays.append(("completion", c.token_ids, c.logprobs, limits.max_tokens_per_completion))
            if not (isinstance(c.reward, float) and math.isfinite(c.reward)):
                bad.append("reward not finite")
        for what, ids, lps, cap in arrays:
            if not (isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1):
                bad.append(f"{what} ids not int64 1-D")
                continue
            total += len(ids)
            if len(ids) > cap:
                bad.append(f"{what} too long")
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= batch.vocab_size):
                bad.append(f"{what} id out of range")
            if lps is not None:
                if not (isinstance(lps, np.ndarray) and lps.dtype == np.float32 and lps.shape == ids.shape):
                    bad.append("logprobs not float32 of the ids' shape")
                elif lps.size and not (np.all(np.isfinite(lps)) and float(lps.max()) <= 0.0):
                    bad.append("logprob not finite or positive")
    if n_comp > limits.max_completions:
        bad.append("too many completions")
    if total > limits.max_total_tokens:
        bad.append("too many tokens")
    return bad


# ------------------------------------------------------------------------------------------ running


def _decode_case(stats: FuzzStats, family: str, name: str, data: bytes, limits: DecodeLimits) -> None:
    run_case(stats, family, name, len(data), lambda: decode_batch_strict(data, limits), refusals=(ProtocolError,),
             check=lambda batch: check_invariants(batch, limits))


def tight_limits() -> DecodeLimits:
    """Limits of the order a tiny node derives from its own round (node.limits.receive_limits)."""
    return DecodeLimits(max_compressed_bytes=1 << 20, max_groups=8, max_completions_per_group=8, max_completions=32,
                        max_prompt_tokens=64, max_tokens_per_completion=48, max_total_tokens=2048, max_string_bytes=64)


FAMILIES = ("body", "bytes", "random")


def generate(rng: np.random.Generator, family: str) -> Iterator[tuple[str, bytes]]:
    """Endless cases of one family: ('body' | 'bytes' | 'random')."""
    while True:
        if family == "random":
            raw = rng.bytes(int(rng.integers(0, 400)))
            j = int(rng.integers(0, 3))
            if j == 0:
                yield "raw", raw
            elif j == 1:
                yield "after_header", HEADER.pack(MAGIC, MAJOR, MINOR, len(raw)) + raw
            else:
                yield "framed", frame(raw, level=1)
            continue
        batch = random_batch(rng)
        layout = int(pick(rng, [ID_PACKED, ID_PLANES]))
        if family == "body":
            body, what = mutate_body(rng, batch_to_body(batch, layout))
            yield what, frame(pack_body(body), level=1)
        else:
            data, what = mutate_bytes(rng, encode_batch(batch, id_layout=layout, level=1))
            yield what, data


def run(n_cases: int, seed: int = 0, *, with_bombs: bool = True,
        progress: Callable[[int], None] | None = None) -> dict[str, FuzzStats]:
    """n_cases mutations (half under default limits, half under tight ones), plus the bombs; stats per limits."""
    rng = np.random.default_rng(seed)
    out = {"default": FuzzStats(), "tight": FuzzStats()}
    limits = {"default": DecodeLimits(), "tight": tight_limits()}
    gens = {f: generate(rng, f) for f in FAMILIES}
    weights = (0.6, 0.25, 0.15)
    for i in range(n_cases):
        family = FAMILIES[int(rng.choice(3, p=weights))]
        name, data = next(gens[family])
        which = "default" if i % 2 == 0 else "tight"
        _decode_case(out[which], family, name, data, limits[which])
        if progress is not None and (i + 1) % 10_000 == 0:
            progress(i + 1)
    if with_bombs:
        for name, data in bombs():
            for which in out:
                _decode_case(out[which], "bomb", name, data, limits[which])
    return out
