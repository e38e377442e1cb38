"""A peer's batch is bounded by the receiving node's own round size before it is decoded."""

from __future__ import annotations

import numpy as np
import pytest

from swarm_node.config import NodeConfig
from swarm_node.grpo.round import receive_limits
from swarm_node.protocol import Completion, Group, ProtocolError, RolloutBatch, decode_batch, encode_batch


def batch(groups: int, g: int, tokens: int) -> RolloutBatch:
    rng = np.random.default_rng(0)
    return RolloutBatch(
        swarm_id="s", task_id="arithmetic-v1", tokenizer_fp="fp", model_name="m", round=1, vocab_size=99,
        groups=[Group(prompt_id=f"arith:id:{i}+1", prompt_ids=np.array([20, 14, 20]),
                      completions=[Completion(rng.integers(3, 99, tokens), -rng.random(tokens).astype(np.float32), 0.0)
                                   for _ in range(g)]) for i in range(groups)],
    )


def test_limits_follow_own_round_size():
    cfg = NodeConfig.model_validate({"task": {"prompts_per_round": 8}, "generation": {"num_generations": 4,
                                                                                   "max_new_tokens": 10}})
    lim = receive_limits(cfg)
    decode_batch(encode_batch(batch(32, 4, 40)), lim)  # 4x our prompts, 4x our completion length: passes
    decode_batch(encode_batch(batch(8, 16, 40)), lim)  # 4x our group size: passes
    with pytest.raises(ProtocolError) as exc:
        decode_batch(encode_batch(batch(33, 4, 10)), lim)
    assert exc.value.reason == "too_many_groups"
    with pytest.raises(ProtocolError) as exc:
        decode_batch(encode_batch(batch(2, 4, 41)), lim)
    assert exc.value.reason == "completion_too_long"
    with pytest.raises(ProtocolError) as exc:
        decode_batch(encode_batch(batch(2, 17, 5)), lim)
    assert exc.value.reason == "too_many_completions"


def long_prompt_batch(groups: int, prompt_len: int) -> RolloutBatch:
    b = batch(groups, 4, 8)
    for gr in b.groups:
        gr.prompt_ids = np.arange(prompt_len) % 90 + 3
    return b


def test_prompt_limits_follow_max_prompt_tokens():
    """Chat prompts run longer than the tiny presets' "12+7=": the bound is the node's own prompt cap, for each
    prompt and in the total, not a fixed 8192 / 512 per group."""
    cfg = NodeConfig.model_validate({"task": {"prompts_per_round": 8}, "generation": {
        "num_generations": 4, "max_new_tokens": 10, "max_prompt_tokens": 2000}})
    lim = receive_limits(cfg)
    decode_batch(encode_batch(long_prompt_batch(32, 2000)), lim)  # 4x our prompts, each at our cap: passes
    with pytest.raises(ProtocolError) as exc:
        decode_batch(encode_batch(long_prompt_batch(2, 2001)), lim)
    assert exc.value.reason == "prompt_too_long"
    short = receive_limits(cfg.model_copy(update={"generation": cfg.generation.model_copy(
        update={"max_prompt_tokens": 64})}))
    with pytest.raises(ProtocolError) as exc:
        decode_batch(encode_batch(long_prompt_batch(2, 65)), short)
    assert exc.value.reason == "prompt_too_long"


def test_the_compressed_cap_is_what_a_valid_batch_can_be():
    """Before: a GRPO node downloaded up to swarm.max_batch_bytes (64 MiB) per offer, 128x what a valid batch
    can be. Now the cap is the zstd bound of the largest body the limits allow (~0.5 MiB by default), and a
    batch at every limit at once still fits it."""
    from swarm_node.protocol.framing import HEADER_SIZE

    default = receive_limits(NodeConfig())
    assert default.body_cap() < default.max_compressed_bytes < 1.01 * default.body_cap() + HEADER_SIZE + 1024
    assert default.max_compressed_bytes < 2**20 < NodeConfig().swarm.max_batch_bytes
    cfg = NodeConfig.model_validate({"task": {"prompts_per_round": 2}, "generation": {
        "num_generations": 2, "max_new_tokens": 16, "max_prompt_tokens": 64}})
    lim = receive_limits(cfg)
    rng = np.random.default_rng(1)
    full = RolloutBatch(  # 4x prompts, 4x tokens, every completion allowed, prompts at the cap, ids over a large vocab
        swarm_id="s", task_id="arithmetic-v1", tokenizer_fp="fp", model_name="m", round=1, vocab_size=1 << 20,
        groups=[Group(prompt_id=f"p{i}", prompt_ids=rng.integers(3, 1 << 20, 64),
                      completions=[Completion(rng.integers(3, 1 << 20, 64), -rng.random(64).astype(np.float32),
                                              float(rng.random())) for _ in range(2)]) for i in range(8)])
    payload = encode_batch(full)
    assert len(payload) <= lim.max_compressed_bytes
    decode_batch(payload, lim)
    small = cfg.model_copy(update={"swarm": cfg.swarm.model_copy(update={"max_batch_bytes": 4096})})
    assert receive_limits(small).max_compressed_bytes == 4096  # swarm.max_batch_bytes still caps it
