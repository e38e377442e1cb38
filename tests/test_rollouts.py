"""peer_groups: what a node trains on from a peer's batch (no network, no trained model).

The swarm's safety rests here: rewards are recomputed locally (a lying peer changes nothing), and a batch
or group this node cannot verify is declined with a counted reason instead of crashing the round.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from swarm_node.generation.base import Sample
from swarm_node.grpo.rollouts import Expectations, LocalRollouts, peer_groups, score
from swarm_node.models.factory import build_tokenizer
from swarm_node.models.loading import tokenizer_fingerprint
from swarm_node.protocol import RolloutBatch, decode_batch, encode_batch
from swarm_node.tasks.arithmetic import ArithmeticTask

SWARM = "unit"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    return ArithmeticTask()


@pytest.fixture(scope="module")
def expect(tok, task) -> Expectations:
    return Expectations(swarm_id=SWARM, task_id=task.task_id, tokenizer_fp=tokenizer_fingerprint(tok),
                        vocab_size=len(tok))


def _sample(tok, text: str, finished: bool = True) -> Sample:
    ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if finished else [])
    n = len(ids)
    return Sample(np.asarray(ids, dtype=np.int64), -np.linspace(0.1, 2.0, n).astype(np.float32), finished)


def _local(tok, task, n_prompts: int = 4) -> LocalRollouts:
    """n prompts x 4 completions: two right answers and two wrong ones per prompt."""
    prompts = task.train_prompts(n_prompts, np.random.default_rng(7))
    ids = [tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    samples = [[_sample(tok, p.answer), _sample(tok, str(int(p.answer) + 1)), _sample(tok, p.answer, finished=False),
                _sample(tok, "x")] for p in prompts]
    return LocalRollouts(prompts, ids, samples, score(task, tok, prompts, samples))


def _batch(local: LocalRollouts, tok, task, **meta) -> RolloutBatch:
    kw = dict(swarm_id=SWARM, task_id=task.task_id, tokenizer_fp=tokenizer_fingerprint(tok), model_name="peer",
              round_=3, vocab_size=len(tok))
    kw.update(meta)
    return local.to_batch(**kw)


def _invert(batch: RolloutBatch) -> RolloutBatch:
    """The same samples with every claimed reward flipped (1 for wrong answers, 0 for right ones)."""
    groups = [dataclasses.replace(g, completions=[dataclasses.replace(c, reward=1.0 - c.reward) for c in g.completions])
              for g in batch.groups]
    return dataclasses.replace(batch, groups=groups)


def test_local_rewards_mix_right_and_wrong(tok, task):
    local = _local(tok, task)
    for r in local.rewards:
        assert r.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_lying_peer_changes_nothing(tok, task, expect):
    local = _local(tok, task)
    honest = peer_groups(_batch(local, tok, task), "peerA", task, tok, expect)
    lying = peer_groups(_invert(_batch(local, tok, task)), "peerB", task, tok, expect)
    assert not honest.rejected and not lying.rejected
    assert honest.rewards_changed == 0
    n_completions = sum(len(s) for s in local.samples)
    assert lying.rewards_changed == n_completions  # every claim was a lie, every one was overridden
    assert len(honest.groups) == len(lying.groups) == len(local.prompts)
    for h, li, want in zip(honest.groups, lying.groups, local.rewards, strict=True):
        np.testing.assert_array_equal(h.rewards, want)
        np.testing.assert_array_equal(li.rewards, want)
        np.testing.assert_array_equal(h.prompt_ids, li.prompt_ids)
        for a, b in zip(h.completions, li.completions, strict=True):
            np.testing.assert_array_equal(a, b)
    assert {g.source for g in lying.groups} == {"peerB"}


def test_trusted_peer_rewards_are_used_as_claimed(tok, task, expect):
    local = _local(tok, task)
    trusting = dataclasses.replace(expect, trust_peer_rewards=True)
    adm = peer_groups(_invert(_batch(local, tok, task)), "peerB", task, tok, trusting)
    assert adm.rewards_changed == 0
    for g, want in zip(adm.groups, local.rewards, strict=True):
        np.testing.assert_array_equal(g.rewards, 1.0 - want)


def test_partial_lies_are_counted(tok, task, expect):
    batch = _batch(_local(tok, task), tok, task)
    g0 = batch.groups[0]
    g0.completions[1] = dataclasses.replace(g0.completions[1], reward=1.0)  # one wrong answer claimed right
    adm = peer_groups(batch, "p", task, tok, expect)
    assert adm.rewards_changed == 1
    assert adm.groups[0].rewards.tolist() == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("swarm_id", "other-swarm", "swarm_mismatch"),
    ("task_id", "gsm8k-v1:abc", "task_mismatch"),
    ("tokenizer_fp", "0123456789abcdef", "tokenizer_mismatch"),
    ("vocab_size", 10_000, "vocab_mismatch"),
])
def test_mismatched_batch_is_declined_whole(tok, task, expect, field, value, reason):
    batch = dataclasses.replace(_batch(_local(tok, task), tok, task), **{field: value})
    adm = peer_groups(batch, "p", task, tok, expect)
    assert adm.groups == []
    assert dict(adm.rejected) == {reason: 1}
    assert adm.rewards_changed == 0


def test_bad_groups_are_declined_one_by_one(tok, task, expect):
    batch = _batch(_local(tok, task, n_prompts=6), tok, task)
    g = batch.groups
    held_out = task.eval_prompts("id", 1)[0]
    g[0] = dataclasses.replace(g[0], prompt_id="arith:id:1000+1")          # out of range: not a task prompt
    g[1] = dataclasses.replace(g[1], prompt_id=held_out.id,                  # an eval problem never trains
                               prompt_ids=np.asarray(tok(held_out.text, add_special_tokens=False)["input_ids"]))
    g[2] = dataclasses.replace(g[2], prompt_ids=np.asarray(tok("1+1=", add_special_tokens=False)["input_ids"]))
    g[3] = dataclasses.replace(g[3], completions=g[3].completions[:1])      # GRPO needs >= 2 per group
    adm = peer_groups(batch, "p", task, tok, expect)
    assert dict(adm.rejected) == {"unknown_prompt": 2, "prompt_mismatch": 1, "group_too_small": 1}
    assert len(adm.groups) == 2
    kept_ids = [list(x.prompt_ids) for x in adm.groups]
    assert kept_ids == [list(g[4].prompt_ids), list(g[5].prompt_ids)]


def test_smaller_vocab_is_accepted(tok, task, expect):
    """A peer whose embedding is smaller (ids all in range) is still usable: only larger vocabularies fail."""
    batch = dataclasses.replace(_batch(_local(tok, task), tok, task), vocab_size=len(tok) - 1)
    adm = peer_groups(batch, "p", task, tok, expect)
    assert not adm.rejected and len(adm.groups) == len(batch.groups)


def test_wire_round_trip_preserves_ids_and_logprobs(tok, task, expect):
    """Real samples from a random tiny model: to_batch -> encode -> decode -> peer_groups."""
    import torch

    from swarm_node.generation.hf import TransformersGenerator
    from swarm_node.models.factory import Preset, build_model

    pre = Preset("llama", hidden=32, layers=1, heads=2, kv_heads=2, intermediate=64, lr_full=1e-3, lr_lora=1e-3)
    model = build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, seed=0)
    gen = TransformersGenerator(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    prompts = task.train_prompts(5, np.random.default_rng(1))
    ids = [tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    with torch.no_grad():
        samples = gen.generate(ids, 4, max_new_tokens=6, temperature=1.0, seed=3)
    local = LocalRollouts(prompts, ids, samples, score(task, tok, prompts, samples))
    wire = encode_batch(_batch(local, tok, task))
    decoded = decode_batch(wire)
    assert decoded.round == 3 and decoded.model_name == "peer"
    adm = peer_groups(decoded, "p", task, tok, expect)
    assert not adm.rejected and adm.rewards_changed == 0
    mine = local.train_groups()
    assert len(adm.groups) == len(mine)
    for theirs, ours in zip(adm.groups, mine, strict=True):
        np.testing.assert_array_equal(theirs.prompt_ids, ours.prompt_ids)
        np.testing.assert_array_equal(theirs.rewards, ours.rewards)
        for a, b in zip(theirs.completions, ours.completions, strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(theirs.behaviour_logprobs, ours.behaviour_logprobs, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, atol=0.01, rtol=0)


def test_repeated_group_counts_once(tok, task, expect):
    batch = _batch(_local(tok, task), tok, task)
    batch = dataclasses.replace(batch, groups=batch.groups + [batch.groups[0]] * 5)
    adm = peer_groups(batch, "p", task, tok, expect)
    assert len(adm.groups) == 4
    assert adm.rejected["duplicate_group"] == 5


def test_a_prompt_drawn_twice_is_shared_once(tok, task, expect):
    """An honest node whose task repeated a prompt this round does not publish a group its peers decline."""
    local = _local(tok, task)
    twice = LocalRollouts(local.prompts + local.prompts[:1], local.prompt_ids + local.prompt_ids[:1],
                          local.samples + local.samples[:1], local.rewards + local.rewards[:1])
    batch = _batch(twice, tok, task)
    assert [g.prompt_id for g in batch.groups] == [p.id for p in local.prompts]
    adm = peer_groups(batch, "p", task, tok, expect)
    assert len(adm.groups) == 4 and not adm.rejected


def test_trusted_reward_that_overflows_float32_is_declined(tok, task, expect):
    batch = _batch(_local(tok, task), tok, task)
    g0 = batch.groups[0]
    g0.completions[0] = dataclasses.replace(g0.completions[0], reward=1e300)  # finite in float64 only
    trusting = dataclasses.replace(expect, trust_peer_rewards=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused by the range check, not after an overflowing float32 cast
        adm = peer_groups(batch, "p", task, tok, trusting)
    assert adm.rejected["reward_out_of_range"] == 1
    assert len(adm.groups) == 3 and all(np.isfinite(g.rewards).all() for g in adm.groups)
