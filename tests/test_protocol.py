"""Wire codec: round trips, one rejection test per kind of bad field, bombs, garbage, bytes per token."""

from __future__ import annotations

import struct
import time

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm_node.protocol import (
    REASONS,
    Completion,
    DecodeLimits,
    Group,
    ProtocolError,
    RolloutBatch,
    decode_batch,
    encode_batch,
)
from swarm_node.protocol import columns as col
from swarm_node.protocol import pids as pid_codec
from swarm_node.protocol.codec import ID_PACKED, ID_PLANES, batch_to_body, pack_body
from swarm_node.protocol.framing import HEADER, MAGIC, MAJOR, frame
from tooling import batches as wire
from tooling.batch_fuzz import check_invariants

LP_TOL = 1 / 128  # documented bound, below the required 0.01


def make_batch(vocab: int = 1000, n_groups: int = 3, g: int = 4, n: int = 10, seed: int = 0) -> RolloutBatch:
    rng = np.random.default_rng(seed)
    groups = [
        Group(
            f"q{i}",
            rng.integers(0, vocab, 7),
            [
                Completion(rng.integers(0, vocab, n), -rng.exponential(1.0, n).astype(np.float32), float(j % 2))
                for j in range(g)
            ],
        )
        for i in range(n_groups)
    ]
    return RolloutBatch("swarm-a", "gsm8k", "sha256:abc", "Qwen/Qwen2.5-0.5B", 7, vocab, groups)


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in ("swarm_id", "task_id", "tokenizer_fp", "model_name", "round", "vocab_size"):
        assert getattr(a, f) == getattr(b, f), f
    assert len(a.groups) == len(b.groups)
    for ga, gb in zip(a.groups, b.groups, strict=True):
        assert ga.prompt_id == gb.prompt_id
        np.testing.assert_array_equal(np.asarray(ga.prompt_ids, np.int64), gb.prompt_ids)
        assert len(ga.completions) == len(gb.completions)
        for ca, cb in zip(ga.completions, gb.completions, strict=True):
            assert cb.token_ids.dtype == np.int64 and cb.logprobs.dtype == np.float32
            np.testing.assert_array_equal(np.asarray(ca.token_ids, np.int64), cb.token_ids)
            lp = np.asarray(ca.logprobs, np.float64)
            assert np.all(np.abs(lp - cb.logprobs) <= LP_TOL)
            assert np.all(cb.logprobs <= 0)
            assert ca.reward == cb.reward


def reframe(body: dict) -> bytes:
    return frame(pack_body(body))


def reason_of(data: bytes, limits: DecodeLimits = DecodeLimits()) -> str:
    with pytest.raises(ProtocolError) as info:
        decode_batch(data, limits)
    assert info.value.reason in REASONS
    return info.value.reason


# --------------------------------------------------------------------------------------------- round trip


@st.composite
def batches(draw) -> RolloutBatch:
    vocab = draw(st.integers(2, 2**18))
    ids = st.lists(st.integers(0, vocab - 1), max_size=20).map(lambda v: np.array(v, dtype=np.int64))
    lp = st.floats(-300.0, 0.0, width=32)
    groups = []
    for _ in range(draw(st.integers(0, 4))):
        comps = []
        for _ in range(draw(st.integers(0, 4))):
            tok = draw(ids)
            lps = np.array(draw(st.lists(lp, min_size=len(tok), max_size=len(tok))), dtype=np.float32)
            comps.append(Completion(tok, lps, draw(st.floats(allow_nan=False, allow_infinity=False))))
        groups.append(Group(draw(st.text(max_size=20)), draw(ids), comps))
    return RolloutBatch(
        draw(st.text(max_size=30)), draw(st.text(max_size=30)), draw(st.text(max_size=64)),
        draw(st.text(max_size=30)), draw(st.integers(0, 2**63 - 1)), vocab, groups,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.sampled_from([None, ID_PACKED, ID_PLANES]))
def test_round_trip(batch: RolloutBatch, layout: int | None) -> None:
    assert_same(batch, decode_batch(encode_batch(batch, id_layout=layout)))


@pytest.mark.parametrize("vocab", [2, 3, 255, 256, 257, 4096, 151_936, 2**18, 2**24])
@pytest.mark.parametrize("layout", [ID_PACKED, ID_PLANES])
def test_round_trip_vocab_sizes(vocab: int, layout: int) -> None:
    batch = make_batch(vocab=vocab, n=300)
    batch.groups[0].completions[0].token_ids[:2] = [0, vocab - 1]
    assert_same(batch, decode_batch(encode_batch(batch, id_layout=layout)))


def test_round_trip_many_distinct_ids_ranked_palette() -> None:
    rng = np.random.default_rng(1)
    batch = make_batch(vocab=151_936, n=2000)
    for g in batch.groups:
        for c in g.completions:
            c.token_ids = np.minimum(rng.zipf(1.2, len(c.token_ids)), 151_935)
    body = batch_to_body(batch)
    assert body["idl"] == ID_PLANES and body["pd"] == 0  # Zipf ids: ranked palette, byte planes
    assert_same(batch, decode_batch(encode_batch(batch)))


def test_edge_values_and_dtypes() -> None:
    batch = make_batch(vocab=70_000, n_groups=2, g=2, n=3)
    c = batch.groups[0].completions[0]
    c.token_ids = np.array([0, 1, 69_999], dtype=np.uint32)
    c.logprobs = np.array([0.0, -0.0, 1 / 200], dtype=np.float32)  # tiny positive rounding noise -> 0
    batch.groups[1].completions = []
    batch.groups[0].completions[1].token_ids = np.array([], dtype=np.int64)
    batch.groups[0].completions[1].logprobs = np.array([], dtype=np.float32)
    out = decode_batch(encode_batch(batch))
    assert_same(batch, out)
    np.testing.assert_array_equal(out.groups[0].completions[0].logprobs, [0, 0, 0])


def test_empty_batch_and_floor() -> None:
    empty = RolloutBatch("s", "t", "f", "m", 0, 2, [])
    assert_same(empty, decode_batch(encode_batch(empty)))
    far = make_batch(n_groups=1, g=1, n=3)
    far.groups[0].completions[0].logprobs = np.array([-1e6, -3e38, -103.97], dtype=np.float32)
    got = decode_batch(encode_batch(far)).groups[0].completions[0].logprobs
    floor = -col.Q_MAX / 64
    np.testing.assert_allclose(got, [floor, floor, -103.97], atol=LP_TOL)


@pytest.mark.parametrize("width", [1, 2, 3, 7, 8, 9, 13, 17, 18, 24, 31, 32])
def test_bit_packing(width: int) -> None:
    rng = np.random.default_rng(width)
    v = rng.integers(0, 2**width, 1001, dtype=np.uint64).astype(np.uint32)
    data = col.pack_bits(v, width)
    assert len(data) == col.packed_size(width, len(v))
    np.testing.assert_array_equal(col.unpack_bits(data, width, len(v)), v)


def test_bit_packing_order_is_lsb_first() -> None:
    assert col.pack_bits(np.array([1, 2, 3]), 2) == bytes([0b00111001])
    assert col.pack_bits(np.array([0x1FF]), 9) == b"\xff\x01"


# --------------------------------------------------------------------------------- header and framing


def test_bad_magic() -> None:
    data = bytearray(encode_batch(make_batch()))
    data[:4] = b"XXXX"
    assert reason_of(bytes(data)) == "bad_magic"


def test_unknown_major_rejected_minor_accepted() -> None:
    data = bytearray(encode_batch(make_batch()))
    for major in (1, 3):  # 1.x (keyed map bodies, before 2.0) and an unknown future major: refused by name
        data[4] = major
        assert reason_of(bytes(data)) == "version"
    data[4], data[5] = MAJOR, 9  # a newer minor of a known major only adds optional slots: accepted
    decode_batch(bytes(data))


def test_too_large_compressed() -> None:
    data = encode_batch(make_batch())
    assert reason_of(data, DecodeLimits(max_compressed_bytes=len(data) - 1)) == "too_large"


@pytest.mark.parametrize("cut", [0, 3, 9, 10, 14, 20, -1])
def test_truncated(cut: int) -> None:
    data = encode_batch(make_batch(n=200))
    assert reason_of(data[:cut]) in {"truncated", "bad_frame"}


def test_trailing_data() -> None:
    assert reason_of(encode_batch(make_batch()) + b"\0") == "trailing_data"


def test_header_length_disagrees_with_frame() -> None:
    data = bytearray(encode_batch(make_batch()))
    struct.pack_into("<I", data, 6, HEADER.unpack_from(data)[3] - 1)
    assert reason_of(bytes(data)) == "bad_frame"


def test_frame_without_content_size() -> None:
    body = pack_body(batch_to_body(make_batch()))
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    zdata = cobj.compress(body) + cobj.flush()
    assert reason_of(HEADER.pack(MAGIC, MAJOR, 0, len(body)) + zdata) == "bad_frame"


def test_decompression_bomb_rejected_cheaply() -> None:
    size = 256 << 20  # 256 MiB of zeros compress to a few KiB
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=True)
    cobj = cctx.compressobj(size=size)
    chunk = bytes(1 << 20)
    zdata = b"".join(cobj.compress(chunk) for _ in range(256)) + cobj.flush()
    assert len(zdata) < 64 << 10
    limits = DecodeLimits(max_decompressed_bytes=16 << 20)
    honest = HEADER.pack(MAGIC, MAJOR, 0, size) + zdata
    lying = HEADER.pack(MAGIC, MAJOR, 0, 1000) + zdata  # header claims little, the frame declares 256 MiB
    t = time.perf_counter()
    assert reason_of(honest, limits) == "decompressed_too_large"
    assert reason_of(lying, limits) == "bad_frame"
    assert time.perf_counter() - t < 0.1


def test_not_msgpack_and_trailing_msgpack() -> None:
    assert reason_of(frame(b"\xc1")) == "msgpack"  # 0xc1 is never valid msgpack
    assert reason_of(frame(msgpack.packb([]) + b"\x00")) == "msgpack"
    assert reason_of(frame(msgpack.packb([1, 2]))) == "schema"  # too few slots
    assert reason_of(frame(msgpack.packb({}))) == "msgpack_limit"  # 2.0 bodies hold no map at all
    assert reason_of(frame(msgpack.packb({1: 2}, use_bin_type=True))) in {"msgpack", "msgpack_limit"}
    assert reason_of(frame(msgpack.packb(msgpack.ExtType(1, b"x")))) == "schema"


# ------------------------------------------------------------------------------------- body fields


def body() -> dict:
    return batch_to_body(make_batch())


def with_(key: str, value) -> bytes:
    b = body()
    b[key] = value
    return reframe(b)


@pytest.mark.parametrize("key", ["swarm", "task", "tok", "model", "round", "vocab", "gn", "pt", "pti", "pn", "ng",
                                 "pl", "cl", "cs", "rv", "ri", "np", "pd", "pal", "idl", "idx", "lps", "lq", "lx"])
def test_missing_key(key: str) -> None:
    b = body()
    del b[key]
    assert reason_of(reframe(b)) == "schema"


@pytest.mark.parametrize(
    "key,value",
    [("swarm", 5), ("round", "7"), ("round", True), ("round", 1.0), ("vocab", None), ("gn", "3"), ("pt", "q"),
     ("pt", b"q"), ("pt", b"\xff\xfe"), ("pti", [1, b"\x05" * 3]),
     ("ng", b"\x04"), ("ng", [1, "x"]), ("ng", [5, b"\0" * 15]), ("rv", 0.0),
     ("rv", np.array([1.0, 0.0]).tobytes()), ("ri", [3, b"\0" * 5]), ("np", -1), ("pd", 2), ("idl", 9), ("lps", 3),
     ("lps", 40)],
)
def test_wrong_type_or_value(key: str, value) -> None:
    assert reason_of(with_(key, value)) == "schema"


def test_unknown_keys_ignored() -> None:
    b = body()
    b["future_field"] = b"y"  # a newer minor's slots after the known ones: scalars and bins
    b["future_scalar"] = 2.5
    b["future_none"] = None
    assert_same(make_batch(), decode_batch(reframe(b)))


@pytest.mark.parametrize("key,value", [("lq", {"a": 1}), ("future", [1, [2]]), ("future", {"a": {"b": 1}}),
                                       ("pt", [["q0"], "q1", "q2"]), ("ng", [1]), ("rv", [0.0]), ("future", [1])])
def test_nested_containers_refused(key: str, value) -> None:
    """The body is one flat array of scalars and bins; any container in it is refused while unpacking."""
    assert reason_of(with_(key, value)) == "msgpack_limit"


def test_string_too_long() -> None:
    assert reason_of(with_("model", "m" * 513)) == "string_too_long"
    assert reason_of(with_("pt", ["q" * 1000] * 3)) == "string_too_long"  # a template
    b = body()
    b["pt"] = ["q" * 510 + pid_codec.HOLE]  # a 513-byte template; 510 + str(n) >= 511 bytes: the id itself
    b["pti"] = list(col.to_planes(np.zeros(3)))
    b["pn"] = list(col.to_planes(np.array([7, 12345, 0])))
    assert reason_of(reframe(b)) == "string_too_long"


def test_vocab_size_bounds() -> None:
    assert reason_of(with_("vocab", 1)) == "vocab_size"
    assert reason_of(with_("vocab", 2**24 + 1)) == "vocab_size"


def test_negative_round() -> None:
    assert reason_of(with_("round", -1)) == "round"


def test_too_many_groups() -> None:
    assert reason_of(encode_batch(make_batch(n_groups=5)), DecodeLimits(max_groups=4)) == "too_many_groups"


def test_too_many_completions() -> None:
    data = encode_batch(make_batch(g=5))
    assert reason_of(data, DecodeLimits(max_completions_per_group=4)) == "too_many_completions"
    assert reason_of(data, DecodeLimits(max_completions=14)) == "too_many_completions"


def test_sequence_and_total_bounds() -> None:
    data = encode_batch(make_batch(n=10))
    assert reason_of(data, DecodeLimits(max_prompt_tokens=6)) == "prompt_too_long"
    assert reason_of(data, DecodeLimits(max_tokens_per_completion=9)) == "completion_too_long"
    assert reason_of(data, DecodeLimits(max_total_tokens=100)) == "too_many_tokens"


def test_huge_declared_counts_rejected_before_allocation() -> None:
    b = body()
    b["ng"] = list(col.to_planes(np.array([2**32 - 1] * 3)))
    assert reason_of(reframe(b)) == "too_many_completions"


@pytest.mark.parametrize("key", ["pti", "pn", "ng", "pl", "cl", "cs", "pal", "idx", "lq", "lx"])
def test_column_length_mismatch(key: str) -> None:
    b = body()
    k, data = b[key]
    b[key] = [k, data + b"\0" * max(k, 1)]
    assert reason_of(reframe(b)) == "length_mismatch"


def test_rewards_length_mismatch() -> None:
    b = body()
    b["rv"] = b["rv"] + b"\0" * 3
    assert reason_of(reframe(b)) == "length_mismatch"
    b = body()
    b["ri"] = [b["ri"][0], b["ri"][1][:-1]]
    assert reason_of(reframe(b)) == "length_mismatch"


def test_logprob_id_length_mismatch_on_encode() -> None:
    batch = make_batch()
    batch.groups[1].completions[2].logprobs = batch.groups[1].completions[2].logprobs[:-1]
    with pytest.raises(ProtocolError) as info:
        encode_batch(batch)
    assert info.value.reason == "length_mismatch"


def test_id_out_of_range() -> None:
    b = body()
    b["vocab"] = b["np"]  # ~130 distinct ids drawn from [0, 1000): some are >= their count
    assert reason_of(reframe(b)) == "id_out_of_range"
    b = body()
    b["np"] -= 1  # the last palette index now points past the palette
    k, pal = b["pal"]
    b["pal"] = [k, col.to_planes(col.from_planes(pal, k, b["np"] + 1)[:-1], k)[1]]
    assert reason_of(reframe(b)) in {"id_out_of_range", "schema"}
    batch = make_batch(vocab=50)
    batch.groups[0].prompt_ids[0] = 50
    with pytest.raises(ProtocolError, match="id_out_of_range"):
        encode_batch(batch)
    batch.groups[0].prompt_ids[0] = -1
    with pytest.raises(ProtocolError, match="id_out_of_range"):
        encode_batch(batch)


def test_packed_index_out_of_palette() -> None:
    batch = make_batch(vocab=256, n=100)  # a palette of 2**width - 1 <= vocab entries, and more tokens
    b = batch_to_body(batch, ID_PACKED)
    width, _ = b["idx"]
    n = sum(len(g.prompt_ids) + sum(len(c.token_ids) for c in g.completions) for g in batch.groups)
    b["idx"] = [width, col.pack_bits(np.full(n, 2**width - 1), width)]
    b["np"] = 2**width - 1
    k = b["pal"][0]
    b["pal"] = [k, bytes(k * b["np"])]  # deltas all 0: a valid palette of one id, repeated
    assert reason_of(reframe(b)) == "id_out_of_range"


@pytest.mark.parametrize("value,reason", [(np.nan, "logprob_not_finite"), (-np.inf, "logprob_not_finite"),
                                          (0.5, "logprob_positive")])
def test_bad_logprobs_refused_on_encode(value: float, reason: str) -> None:
    batch = make_batch()
    batch.groups[0].completions[0].logprobs[3] = value
    with pytest.raises(ProtocolError) as info:
        encode_batch(batch)
    assert info.value.reason == reason


def test_logprobs_decode_finite_and_nonpositive_by_construction() -> None:
    b = body()
    k, data = b["lq"]
    n = len(data) // k
    b["lq"] = list(col.to_planes(np.full(n, 255)))
    b["lx"] = [3, col.to_planes(np.full(n, col.Q_MAX - 255), 3)[1]]
    lps = [c.logprobs for g in decode_batch(reframe(b)).groups for c in g.completions]
    assert all(np.all(np.isfinite(x)) and np.all(x <= 0) for x in lps)
    b["lx"] = [3, col.to_planes(np.full(n, col.Q_MAX - 254), 3)[1]]
    assert reason_of(reframe(b)) == "schema"
    b["lq"] = [2, col.to_planes(np.full(n, 256), 2)[1]]  # the low column stops at the escape value 255
    assert reason_of(reframe(b)) == "schema"


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_reward_not_finite(value: float) -> None:
    b = body()
    table = np.frombuffer(b["rv"], "<f8").copy()
    table[-1] = value  # the largest bit pattern stays last: NaN and +-inf sort above 0.0 and 1.0
    b["rv"] = table.tobytes()
    assert reason_of(reframe(b)) == "reward_not_finite"
    batch = make_batch()
    batch.groups[0].completions[1].reward = value
    with pytest.raises(ProtocolError, match="reward_not_finite"):
        encode_batch(batch)


def test_encode_refuses_what_decode_would_refuse() -> None:
    for field, value, reason in [("round", -2, "round"), ("vocab_size", 1, "vocab_size"),
                                 ("model_name", "x" * 600, "string_too_long"), ("task_id", None, "schema")]:
        batch = make_batch()
        setattr(batch, field, value)
        with pytest.raises(ProtocolError) as info:
            encode_batch(batch)
        assert info.value.reason == reason


def test_error_reason_is_checked() -> None:
    with pytest.raises(AssertionError):
        ProtocolError("not_a_reason")


# ------------------------------------------------------------------------------------------ fuzzing


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_only_raises_protocol_error(data: bytes) -> None:
    for payload in (data, HEADER.pack(MAGIC, MAJOR, 0, len(data)) + data, frame(data)):
        with pytest.raises(ProtocolError):
            decode_batch(payload)


_VALID = encode_batch(make_batch(n=40))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupted_payload_only_raises_protocol_error(flips: list[tuple[int, int]]) -> None:
    data = bytearray(_VALID)
    for pos, byte in flips:
        data[pos] = byte
    assert_refused_by_a_real_check_or_valid(bytes(data))


def assert_refused_by_a_real_check_or_valid(data: bytes, limits: DecodeLimits = DecodeLimits()) -> None:
    """Either a specific check refuses the payload, or what comes back keeps every documented invariant.

    `internal` is decode_batch's safety net for exceptions no check anticipated: it must never answer.
    """
    try:
        batch = decode_batch(data, limits)
    except ProtocolError as exc:
        assert exc.reason in REASONS and exc.reason != "internal", exc
        return
    assert check_invariants(batch, limits) == []


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=8),
                  st.binary(max_size=16))
_obj = st.recursive(_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                  st.dictionaries(st.text(max_size=5), kids, max_size=4)), max_leaves=12)


_column_like = st.one_of(st.lists(_leaf, min_size=2, max_size=2),  # [k, bin] with either part wrong
                         st.tuples(st.integers(-1, 5), st.one_of(st.binary(max_size=64), _leaf)).map(list))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(body())), st.one_of(_obj, _column_like), max_size=3), st.booleans())
def test_mutated_bodies_only_raise_protocol_error(patch: dict, start_valid: bool) -> None:
    b = body() if start_valid else {}
    b.update(patch)
    assert_refused_by_a_real_check_or_valid(reframe(b))


@pytest.mark.parametrize("payload", [frame(msgpack.packb([])), frame(msgpack.packb(None)), frame(b"\x00")])
def test_catch_all_is_not_what_answers(payload: bytes) -> None:
    """A body that is no array of slots is refused by the type check (`schema`), not by the safety net."""
    assert reason_of(payload) == "schema"


# ------------------------------------------------------------------------------------ bytes per token


@pytest.fixture(scope="module")
def tiny_batches() -> dict[str, RolloutBatch]:
    flat = wire.sample_tiny_batch(n_prompts=16, group_size=8, max_new=12)
    peaked = wire.sample_tiny_batch(n_prompts=16, group_size=8, max_new=12, logit_scale=8.0)
    return {"flat": flat, "flat->qwen": wire.remap_vocab(flat), "peaked": peaked, "peaked->qwen": wire.remap_vocab(peaked)}


@pytest.mark.parametrize("name", ["flat", "flat->qwen", "peaked", "peaked->qwen"])
def test_bytes_per_token_tiny_model(tiny_batches: dict[str, RolloutBatch], name: str) -> None:
    batch = tiny_batches[name]
    data = encode_batch(batch)
    bpt = len(data) / batch.num_completion_tokens()
    print(f"{name}: {bpt:.3f} B/token over {batch.num_completion_tokens()} tokens")
    assert bpt <= 3.0
    assert_same(batch, decode_batch(data))


def test_bytes_per_token_qwen_sized_zipf() -> None:
    batch = wire.zipf_batch(n_prompts=4, group_size=8)
    assert len(encode_batch(batch)) / batch.num_completion_tokens() <= 3.0
