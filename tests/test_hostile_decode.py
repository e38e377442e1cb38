"""Decoder amplification (docs/security.md: decompression and msgpack bombs, columns without planes).

Bombs are refused cheaply, and decode work is bounded by the receiver's own limits. Memory is measured with
tracemalloc (numpy, zstandard and msgpack allocations are all traced), never wall time."""

from __future__ import annotations

import tracemalloc

import msgpack
import numpy as np
import pytest

from swarm_node.config import NodeConfig
from swarm_node.grpo.round import receive_limits
from swarm_node.protocol import (
    Completion,
    DecodeLimits,
    Group,
    ProtocolError,
    RolloutBatch,
    decode_batch,
    encode_batch,
)
from swarm_node.protocol import columns as col
from swarm_node.protocol.codec import ID_PACKED, ID_PLANES, batch_to_body, pack_body
from swarm_node.protocol.framing import HEADER, MAGIC, MAJOR, frame
from tooling.batch_fuzz import empty_planes_bomb, nested_arrays_bomb, tight_limits, zeros_bomb

MiB = 1 << 20


def refusal(data: bytes, limits: DecodeLimits) -> tuple[str, int]:
    """(reason, peak traced bytes) of a decode that must be refused."""
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as info:
            decode_batch(data, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value.reason, peak


def node_limits() -> DecodeLimits:
    """What a node with the default config (a tiny model's round) accepts from a peer."""
    return receive_limits(NodeConfig())


def test_decompressed_cap_is_derived_from_the_receive_limits() -> None:
    lim = node_limits()
    assert lim.max_decompressed_bytes == 256 * MiB  # the config does not set it...
    assert lim.body_cap() < 4 * MiB  # ...but the cap follows the token and group limits
    assert DecodeLimits().body_cap() < 128 * MiB
    data = zeros_bomb(lim.body_cap() + 1)
    assert refusal(data, lim)[0] == "decompressed_too_large"


@pytest.mark.parametrize("layout", [ID_PACKED, ID_PLANES])
def test_the_largest_valid_batch_fits_the_cap(layout: int) -> None:
    """body_cap must never refuse an honest batch: fill every limit, with ids that need 3 bytes each."""
    lim = tight_limits()
    rng = np.random.default_rng(0)
    per_group = lim.max_completions // lim.max_groups
    n_tok = lim.max_tokens_per_completion
    n_prompt = min(lim.max_prompt_tokens, (lim.max_total_tokens - lim.max_completions * n_tok) // lim.max_groups)
    assert n_prompt > 0
    groups = [Group("p" * lim.max_string_bytes, rng.integers(0, 1 << 24, n_prompt),
                    [Completion(rng.integers(0, 1 << 24, n_tok), -rng.uniform(0, 20000, n_tok).astype(np.float32), 1.0)
                     for _ in range(per_group)]) for _ in range(lim.max_groups)]
    batch = RolloutBatch("s" * 64, "t" * 64, "f" * 64, "m" * 64, 2**62, 1 << 24, groups)
    body = pack_body(batch_to_body(batch, layout))
    assert len(body) <= lim.body_cap()
    decode_batch(frame(body), lim)


def test_nested_empty_arrays_bomb_is_refused_cheaply() -> None:
    """A few KiB of zstd that inflate to 4 Mi empty msgpack arrays: one list each used to cost ~90 B."""
    data = nested_arrays_bomb(4 * MiB)
    assert len(data) < 4096
    reason, peak = refusal(data, DecodeLimits())
    assert reason == "msgpack_limit"
    assert peak < 4 * MiB + 2 * MiB  # the body itself, not one Python object per byte (was ~370 MiB)
    reason, peak = refusal(data, node_limits())
    assert reason == "decompressed_too_large" and peak < MiB  # over the node's own cap: never inflated
    deep = nested_arrays_bomb(100_000, deep=True)
    assert refusal(deep, DecodeLimits())[0] in {"msgpack", "msgpack_limit"}


def test_arrays_within_the_length_limit_cannot_nest() -> None:
    """Containers of legal length nested in each other are refused as soon as the first one closes."""
    inner = b"\x9f" + b"\x90" * 15  # [[] x 15]
    body = b"\xdc" + (4000).to_bytes(2, "big") + inner * 4000
    reason, peak = refusal(frame(body), DecodeLimits())
    assert reason == "msgpack_limit" and peak < 2 * len(body) + MiB


def test_empty_plane_payload_is_refused_before_allocating() -> None:
    """Counts from small columns, no bytes behind the token columns: refused, not inflated to 2**23 tokens."""
    data = empty_planes_bomb(n_groups=64, per_group=1024, tokens=128)  # 64 x 1024 completions x 128 tokens
    assert len(data) < 1024
    reason, peak = refusal(data, DecodeLimits())
    assert reason == "missing_planes"
    assert peak < 8 * MiB  # before 1.1 this batch was accepted at about 250 MiB
    reason, peak = refusal(data, node_limits())
    assert peak < 2 * MiB
    # the 2**26-token variant of the issue is refused by the token limit, before any column is read
    big = empty_planes_bomb(n_groups=64, per_group=1024, tokens=1024)
    assert refusal(big, DecodeLimits())[0] == "too_many_tokens"


@pytest.mark.parametrize("key", ["pl", "cl", "pal", "lq"])
def test_every_column_must_carry_its_planes(key: str) -> None:
    batch = RolloutBatch("s", "t", "f", "m", 1, 1000,
                         [Group("q", np.array([5, 6]), [Completion(np.array([7, 8, 9]), np.zeros(3, np.float32), 1.0),
                                                        Completion(np.array([7]), np.zeros(1, np.float32), 0.0)])])
    body = batch_to_body(batch, ID_PLANES)
    body[key] = [0, b""]
    assert refusal(frame(pack_body(body)), DecodeLimits())[0] == "missing_planes"


def test_packed_indices_need_at_least_one_bit() -> None:
    batch = RolloutBatch("s", "t", "f", "m", 1, 10, [Group("q", np.array([3, 3]), [
        Completion(np.array([3, 3, 3]), np.zeros(3, np.float32), 1.0), Completion(np.array([3]), np.zeros(1, np.float32), 0.0)])])
    body = batch_to_body(batch, ID_PACKED)
    assert body["idx"][0] == 1 and body["lq"][0] == 1  # one distinct id, all log-probs 0: still backed by bytes
    assert decode_batch(frame(pack_body(body))).groups[0].completions[0].token_ids.tolist() == [3, 3, 3]
    body["idx"] = [0, b""]  # how a 1.0 encoder sent a one-id palette
    assert refusal(frame(pack_body(body)), DecodeLimits())[0] == "missing_planes"


def test_msgpack_length_limits_follow_the_receive_limits() -> None:
    lim = node_limits()
    caps = lim.msgpack_limits()
    over_bin = {"x": bytes(caps["max_bin_len"] + 1)}
    over_array = {"x": [0] * (caps["max_array_len"] + 1)}
    over_map = {f"k{i}": 0 for i in range(caps["max_map_len"] + 1)}
    for body in (over_bin, over_array, over_map):
        assert refusal(frame(pack_body(body)), lim)[0] == "msgpack_limit"


def test_a_valid_batch_at_the_node_limits_decodes_within_a_small_multiple_of_the_cap() -> None:
    """Honest worst case under the node's own limits: decode memory stays a small multiple of body_cap."""
    lim = node_limits()
    rng = np.random.default_rng(1)
    per_group = lim.max_completions // lim.max_groups
    groups = [Group(f"g{i}", rng.integers(0, 50_000, 64),
                    [Completion(rng.integers(0, 50_000, lim.max_tokens_per_completion),
                                -rng.exponential(2.0, lim.max_tokens_per_completion).astype(np.float32), 0.5)
                     for _ in range(per_group)]) for i in range(lim.max_groups)]
    data = encode_batch(RolloutBatch("s", "t", "f", "m", 3, 50_000, groups))
    tracemalloc.start()
    try:
        decode_batch(data, lim)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\nnode limits: body cap {lim.body_cap() / MiB:.2f} MiB, honest max-size decode peak {peak / MiB:.2f} MiB")
    assert peak < 8 * lim.body_cap()


def test_version_1_payloads_are_refused_by_name() -> None:
    """2.0 changed the body (docs/protocol.md, version rule): a 1.x peer's payload is refused as `version`,
    before its body is inflated, and a non-empty column must still carry at least one plane."""
    body = batch_to_body(RolloutBatch("s", "t", "f", "m", 1, 10, [Group("q", np.array([1]), [
        Completion(np.array([2]), np.zeros(1, np.float32), 0.0), Completion(np.array([2]), np.zeros(1, np.float32), 0.0)])]))
    raw = msgpack.packb(body, use_bin_type=True)  # the 1.x form: a keyed map
    for minor in (0, 1):
        old = HEADER.pack(MAGIC, 1, minor, len(raw)) + frame(raw)[HEADER.size:]
        assert refusal(old, DecodeLimits())[0] == "version"
    body["lq"] = [0, b""]
    assert refusal(frame(pack_body(body)), DecodeLimits())[0] == "missing_planes"
    assert col.plane_count(np.zeros(5)) == 1 and col.plane_count(np.zeros(0)) == 0 and MAJOR == 2
