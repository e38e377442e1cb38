"""Wire 2.0 on what a demo node really sends: exact round trips and the bytes-per-token target.

The fixture is one round of a trained tiny-s preset (tests/data/wire_batch_tiny_s.json: 16 arithmetic
prompts x 8 completions of up to 6 tokens, seed 7, which the zstd dictionary's training corpus did not
include), written by tooling/batches.py's preset_batches + batch_to_json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from swarm_node.protocol import Completion, Group, RolloutBatch, decode_batch, encode_batch
from swarm_node.protocol import pids as pid_codec
from swarm_node.protocol.codec import LOGPROB_SCALE_BITS, batch_to_body
from swarm_node.protocol.columns import from_planes
from swarm_node.protocol.sharing import D_SPAN
from tooling.batches import batch_from_json

FIXTURE = Path(__file__).parent / "data" / "wire_batch_tiny_s.json"
LP_BOUND = 2.0 ** -(LOGPROB_SCALE_BITS + 1)  # docs/protocol.md: |decoded - sent| <= 1/128


@pytest.fixture(scope="module")
def demo_batch() -> RolloutBatch:
    return batch_from_json(json.loads(FIXTURE.read_text()))


def assert_exact(sent: RolloutBatch, got: RolloutBatch) -> None:
    assert [g.prompt_id for g in got.groups] == [g.prompt_id for g in sent.groups]
    for gs, gg in zip(sent.groups, got.groups, strict=True):
        np.testing.assert_array_equal(gg.prompt_ids, gs.prompt_ids)
        assert len(gg.completions) == len(gs.completions)
        for cs, cg in zip(gs.completions, gg.completions, strict=True):
            np.testing.assert_array_equal(cg.token_ids, cs.token_ids)
            assert cg.logprobs.shape == cs.token_ids.shape
            assert np.max(np.abs(cg.logprobs.astype(np.float64) - cs.logprobs), initial=0.0) <= LP_BOUND
            assert np.float64(cg.reward).tobytes() == np.float64(cs.reward).tobytes()  # bit for bit


def test_trained_preset_batch_round_trips_exactly(demo_batch: RolloutBatch) -> None:
    assert_exact(demo_batch, decode_batch(encode_batch(demo_batch)))


def test_trained_preset_batch_is_under_1_5_bytes_per_token(demo_batch: RolloutBatch) -> None:
    """Wire 1.1 sent this very batch in 942 bytes, 2.14 B/token (float64 rewards, id strings, keys, no sharing)."""
    size = len(encode_batch(demo_batch))
    bpt = size / demo_batch.num_completion_tokens()
    print(f"\ntrained tiny-s batch: {size} bytes, {demo_batch.num_completion_tokens()} tokens, {bpt:.3f} B/token")
    assert bpt <= 1.5


def test_repeats_and_shared_prefixes_are_sent_once(demo_batch: RolloutBatch) -> None:
    body = batch_to_body(demo_batch)
    k, data = body["cs"]
    cs = from_planes(data, k, len(data) // k).astype(np.int64)
    shared = cs // D_SPAN
    total = demo_batch.num_completion_tokens()
    new = len(body["lq"][1]) // body["lq"][0]
    assert new == total - int(shared.sum()) and new < 0.6 * total  # most sampled tokens repeat within a group
    assert int(np.unique(np.frombuffer(body["rv"], "<u8")).size) == 2  # rewards 0.0 and 1.0: a 2-entry table


def test_sharing_is_exact_when_ids_match_but_logprobs_do_not() -> None:
    ids = np.array([5, 6, 7, 8])
    a = Completion(ids, np.array([-0.1, -0.2, -0.3, -0.4], np.float32), 1.0)
    b = Completion(ids.copy(), np.array([-0.1, -0.2, -2.0, -0.4], np.float32), -0.0)  # same ids, lp differs at 2
    c = Completion(ids[:2].copy(), a.logprobs[:2].copy(), 1.0)  # a prefix of a
    d = Completion(ids.copy(), a.logprobs.copy(), 5e-324)  # a repeat of a, with a denormal reward
    batch = RolloutBatch("s", "t", "f", "m", 1, 10, [Group("q:1", np.array([1, 2]), [a, b, c, d]),
                                                     Group("q:2", np.array([3]), [Completion(ids.copy(), a.logprobs.copy(), 0.0)])])
    body = batch_to_body(batch)
    k, data = body["cs"]
    cs = from_planes(data, k, len(data) // k).astype(np.int64)
    assert (cs % D_SPAN).tolist() == [0, 1, 1, 3, 0]  # the nearest of equal matches; never from another group
    assert (cs // D_SPAN).tolist() == [0, 2, 2, 4, 0]
    assert_exact(batch, decode_batch(encode_batch(batch)))


@pytest.mark.parametrize("pid", ["arith:id:97-69", "arith:ood:0", "x007y", "12345678901234", "", "7", "a1b2c3d4e5f6g7h8i9j10",
                                 "gsm8k:train:1234", "é漢:42:🙂", "rg:chain_sum:3:0", "p0:\x00\x01"])
def test_prompt_id_templates_round_trip(pid: str) -> None:
    templates, index, numbers = pid_codec.encode_ids([pid, pid + "1", "other"])
    assert pid_codec.decode_ids(templates, index, numbers) == [pid, pid + "1", "other"]
    template, nums = pid_codec.split_id(pid)
    assert len(nums) <= pid_codec.MAX_NUMBERS and all(n < 10**9 for n in nums)


def test_prompt_ids_of_a_task_share_one_template(demo_batch: RolloutBatch) -> None:
    templates, index, numbers = pid_codec.encode_ids([g.prompt_id for g in demo_batch.groups])
    assert len(templates) <= 2 and len(numbers) == 2 * len(demo_batch.groups)  # 'arith:id:a+b', 'arith:id:a-b'
