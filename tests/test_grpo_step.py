"""FTISTrainer on a tiny random Llama: log-prob recompute with padding, sign, micro-batching, LoRA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from swarm_node.config import TrainingConfig
from swarm_node.training.ftis import group_advantages
from swarm_node.training.ftis_step import FTISTrainer
from swarm_node.training.groups import TrainGroup

VOCAB, PAD = 32, 0


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(cfg).float()


def random_group(rng, g=4, source="local", prompt_len=None, rewards=None) -> TrainGroup:
    plen = prompt_len or int(rng.integers(1, 6))
    comps = [rng.integers(1, VOCAB, size=int(rng.integers(1, 7))) for _ in range(g)]
    return TrainGroup(
        prompt_ids=rng.integers(1, VOCAB, size=plen).tolist(),
        completions=comps,
        behaviour_logprobs=[np.zeros(len(c), np.float32) for c in comps],
        rewards=np.asarray(rewards if rewards is not None else rng.integers(0, 2, size=g), np.float32),
        source=source,
    )


def with_behaviour(trainer: FTISTrainer, groups, shift: float = 0.0, noise: float = 0.0, seed: int = 0):
    """Set behaviour log-probs to the model's own (on-policy), optionally perturbed (off-policy)."""
    rng = np.random.default_rng(seed)
    for g, lps in zip(groups, trainer.completion_logprobs(groups), strict=True):
        g.behaviour_logprobs = [
            np.minimum(lp + shift + noise * rng.standard_normal(lp.shape), 0).astype(np.float32) for lp in lps
        ]
    return groups


def reference_logprobs(model, prompt, completion) -> np.ndarray:
    ids = torch.tensor(np.concatenate([prompt, completion]))[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    p = len(prompt)
    return np.array([lp[p - 1 + j, int(completion[j])].item() for j in range(len(completion))])


def test_micro_batched_logprobs_match_unbatched_forward():
    model = tiny_llama()
    rng = np.random.default_rng(0)
    groups = [random_group(rng) for _ in range(4)]
    trainer = FTISTrainer(model, TrainingConfig(micro_batch_size=3, lr=1e-3), PAD, "cpu")
    got = trainer.completion_logprobs(groups)
    for g, lps in zip(groups, got, strict=True):
        for c, lp in zip(g.completions, lps, strict=True):
            ref = reference_logprobs(model, g.prompt_ids, c)
            assert lp.shape == ref.shape
            assert np.max(np.abs(lp - ref)) < 1e-5


def head_rows(model, fn):
    """Run fn() and return the shapes of the output head's inputs."""
    seen: list[tuple[int, ...]] = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, inp, _out: seen.append(tuple(inp[0].shape)))
    try:
        return fn(), seen
    finally:
        hook.remove()


@pytest.mark.parametrize("share", [True, False])
def test_output_head_runs_on_completion_positions_only(share):
    """Prompts of different lengths share a micro-batch; lm_head sees exactly the positions that predict a
    completion token (no prompt, no padding), and the log-probs still equal an unpadded forward, for a full
    and a PEFT model, with and without one forward per prompt."""
    from peft import LoraConfig, get_peft_model

    rng = np.random.default_rng(3)
    groups = [random_group(rng, prompt_len=n) for n in (2, 9, 5)]
    cmax = max(len(c) for g in groups for c in g.completions)
    for model in (tiny_llama(4), get_peft_model(tiny_llama(4), LoraConfig(r=2, target_modules=["q_proj"]))):
        trainer = FTISTrainer(model, TrainingConfig(micro_batch_size=12, lr=1e-3), PAD, "cpu", share_prompts=share)
        got, seen = head_rows(model, lambda t=trainer: t.completion_logprobs(groups))
        tokens = sum(len(c) for g in groups for c in g.completions)
        assert cmax * 12 > tokens  # padding exists, and the head must not see it
        assert seen == [(tokens, 32)], seen  # one chunk of hidden states: the completion tokens, no more
        for g, lps in zip(groups, got, strict=True):
            for c, lp in zip(g.completions, lps, strict=True):
                assert np.max(np.abs(lp - reference_logprobs(model, g.prompt_ids, c))) < 1e-5


def test_one_forward_per_prompt_gives_the_same_gradient():
    """The shared-prompt forward (the prompt's keys and values gathered out to its completions) and one whole
    forward per sequence give the same loss gradient, full model and LoRA."""
    from peft import LoraConfig, get_peft_model

    rng = np.random.default_rng(5)
    groups = [random_group(rng, g=4, prompt_len=n, rewards=[1, 0, 0, 1]) for n in (3, 7)]
    for make in (lambda: tiny_llama(6), lambda: get_peft_model(tiny_llama(6), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))):
        grads = []
        for share in (True, False):
            model = make()
            trainer = FTISTrainer(model, TrainingConfig(micro_batch_size=5, lr=1e-3), PAD, "cpu", share_prompts=share)
            with_behaviour(trainer, groups, shift=-0.1)
            trainer.accumulate_gradients(trainer.prepare(groups))
            grads.append(torch.cat([p.grad.flatten() for p in trainer.params]))
        assert grads[0].abs().max() > 0
        assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4), float((grads[0] - grads[1]).abs().max())


def test_a_prefix_shared_by_all_prompts_runs_once_with_the_same_gradient():
    """Prompts behind one long common prefix (a chat template's system turn): the prefix is one forward of its
    own, and the log-probs and the gradient equal one whole forward per sequence."""
    from swarm_node.training.ftis_step import MIN_SHARED_PREFIX

    rng = np.random.default_rng(8)
    prefix = rng.integers(1, VOCAB, size=MIN_SHARED_PREFIX + 3).tolist()
    groups = [random_group(rng, g=3, rewards=[1, 0, 1]) for _ in range(3)]
    for g, tail in zip(groups, (2, 5, 1), strict=True):
        g.prompt_ids = prefix + rng.integers(1, VOCAB, size=tail).tolist()
    grads, logps = [], []
    for share in (True, False):
        model = tiny_llama(9)
        trainer = FTISTrainer(model, TrainingConfig(micro_batch_size=16, lr=1e-3), PAD, "cpu", share_prompts=share)
        with_behaviour(trainer, groups, shift=-0.2)
        seen_inputs: list[tuple[int, ...]] = []
        hook = model.get_decoder().register_forward_pre_hook(
            lambda _m, args, kwargs, seen=seen_inputs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        try:
            got = trainer.completion_logprobs(groups)
        finally:
            hook.remove()
        logps.append(got)
        if share:  # the prefix alone, the 3 tails, then the 9 completions
            assert [s[0] for s in seen_inputs] == [1, 3, 9], seen_inputs
            assert seen_inputs[0][1] == len(prefix)
        else:  # share_prompts=False: one whole forward of the 9 sequences, the reference the shared one must equal
            assert [s[0] for s in seen_inputs] == [9] and not trainer.shares_prompts(), seen_inputs
        trainer.accumulate_gradients(trainer.prepare(groups))
        grads.append(torch.cat([p.grad.flatten() for p in trainer.params]))
    for a, b in zip(logps[0], logps[1], strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4), float((grads[0] - grads[1]).abs().max())


def test_positive_advantage_raises_logprob_and_params_change():
    model = tiny_llama(1)
    rng = np.random.default_rng(1)
    group = random_group(rng, g=4, prompt_len=3, rewards=[1, 0, 0, 0])
    trainer = FTISTrainer(model, TrainingConfig(lr=1e-2, micro_batch_size=2), PAD, "cpu")
    with_behaviour(trainer, [group])
    before_params = [p.detach().clone() for p in model.parameters()]
    before = trainer.completion_logprobs([group])[0][0].sum()
    for _ in range(3):
        res = trainer.step([group])
        assert res.stepped and res.optimizer_steps == 1
    after = trainer.completion_logprobs([group])[0][0].sum()
    assert after > before + 0.1
    assert any(not torch.equal(a, b) for a, b in zip(before_params, model.parameters(), strict=True))
    assert res.groups_local == 1 and res.seqs_kept == 4 and res.completion_tokens > 0


def _grads(model, cfg, groups):
    trainer = FTISTrainer(model, cfg, PAD, "cpu")
    stats = trainer.accumulate_gradients(trainer.prepare(groups))
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, stats


def test_micro_batch_size_does_not_change_gradient():
    model = tiny_llama(2)
    rng = np.random.default_rng(2)
    groups = [
        random_group(rng, g=5),
        random_group(rng, g=5, source="peerA"),
        random_group(rng, g=3, source="peerB"),
    ]
    probe = FTISTrainer(model, TrainingConfig(lr=1e-3), PAD, "cpu")
    with_behaviour(probe, groups[:1])
    with_behaviour(probe, groups[1:], shift=0.5, noise=1.0, seed=3)  # off-policy: some truncation
    results = []
    for mb in (1, 8):
        cfg = TrainingConfig(variant="ftis", micro_batch_size=mb, lr=1e-3, filter_threshold=0.3)
        results.append(_grads(model, cfg, groups))
    (g1, s1), (g8, s8) = results
    assert g1.keys() == g8.keys() and len(g1) > 0
    for name in g1:
        torch.testing.assert_close(g1[name], g8[name], rtol=1e-4, atol=1e-6)
    assert np.array_equal(s1.kept, s8.kept)
    assert s1.filtered.any() and s1.kept.any() and (s1.truncated_frac > 0).any()  # all code paths exercised
    assert s1.loss == pytest.approx(s8.loss, rel=1e-4, abs=1e-6)


def test_advantages_use_whole_group_even_when_filtered():
    model = tiny_llama(3)
    rng = np.random.default_rng(3)
    group = random_group(rng, g=4, source="peer", rewards=[1, 0, 0, 1])
    trainer = FTISTrainer(model, TrainingConfig(lr=1e-3, filter_threshold=1.0), PAD, "cpu")
    with_behaviour(trainer, [group])
    group.behaviour_logprobs[1] = np.zeros_like(group.behaviour_logprobs[1])  # log q = 0: far off-policy
    batch = trainer.prepare([group])
    expected = group_advantages(torch.tensor([1.0, 0, 0, 1])).tolist()
    assert [s.advantage for s in batch.sequences] == pytest.approx(expected)
    res = trainer.step([group])
    assert res.seqs_filtered == 1 and res.seqs_filtered_external == 1 and res.seqs_kept == 3
    assert res.stepped


def test_lora_only_adapter_changes():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_llama(4),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    rng = np.random.default_rng(4)
    groups = [random_group(rng, rewards=[1, 0, 1, 0]), random_group(rng, rewards=[0, 0, 1, 0])]
    trainer = FTISTrainer(model, TrainingConfig(lr=1e-2, optimizer="adamw"), PAD, "cpu")
    with_behaviour(trainer, groups)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = trainer.step(groups)
    assert res.stepped
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and all("lora_" in n for n in changed)


def test_on_policy_drops_external_groups():
    model = tiny_llama(5)
    rng = np.random.default_rng(5)
    groups = [random_group(rng, rewards=[1, 0, 0, 0]), random_group(rng, source="peer", rewards=[0, 1, 0, 0])]
    trainer = FTISTrainer(model, TrainingConfig(variant="on_policy", lr=1e-3), PAD, "cpu")
    with_behaviour(trainer, groups)
    res = trainer.step(groups)
    assert res.groups_local == 1 and res.groups_external == 0 and res.groups_dropped_external == 1
    assert res.seqs_kept_external == 0 and res.seqs_kept_local == 4
    assert res.mean_ratio == pytest.approx(1.0, abs=1e-4)


def test_no_usable_group_and_zero_advantage_skip():
    model = tiny_llama(6)
    rng = np.random.default_rng(6)
    trainer = FTISTrainer(model, TrainingConfig(lr=1e-3), PAD, "cpu")
    res = trainer.step([random_group(rng, rewards=[1, 1, 1, 1])])
    assert not res.stepped and res.reason == "no usable group" and res.groups_zero_advantage == 1
    res = trainer.step([])
    assert not res.stepped


def test_several_steps_per_round_and_state_dict():
    model = tiny_llama(7)
    rng = np.random.default_rng(7)
    groups = [random_group(rng, rewards=[1, 0, 0, 1]), random_group(rng, source="p", rewards=[0, 1, 0, 0])]
    cfg = TrainingConfig(lr=5e-2, steps_per_round=3, clip_eps=0.1)
    trainer = FTISTrainer(model, cfg, PAD, "cpu")
    with_behaviour(trainer, groups)
    res = trainer.step(groups)
    assert res.optimizer_steps == 3 and len(res.losses) == 3
    assert res.clipped_frac > 0  # lr is large enough that some ratios leave [1 - eps, 1 + eps]
    state = trainer.state_dict()
    other = FTISTrainer(model, cfg, PAD, "cpu")
    other.load_state_dict(state)
    assert other.steps_done == 3
    assert other.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()


def test_lr_default_used_when_config_has_none():
    model = tiny_llama(8)
    trainer = FTISTrainer(model, TrainingConfig(), PAD, "cpu", lr_default=1e-4)
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-4
    trainer.step([], lr_default=3e-4)
    assert trainer.optimizer.param_groups[0]["lr"] == 3e-4


def _logprobs_at(model, prompt, completion, temperature: float) -> np.ndarray:
    ids = torch.tensor(np.concatenate([prompt, completion]))[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    lp = torch.log_softmax(logits, -1)
    p = len(prompt)
    return np.array([lp[p - 1 + t, completion[t]].item() for t in range(len(completion))], np.float32)


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_own_samples_are_on_policy_at_the_sampling_temperature(temperature):
    """Behaviour log-probs are log_softmax(logits / T); the trainer recomputes at the same T, so own samples
    have ratio 1 and divergence 0 at any T. A trainer at T = 1 (the old behaviour) sees them off-policy."""
    model = tiny_llama(11)
    rng = np.random.default_rng(11)
    groups = [random_group(rng, rewards=[1, 0, 0, 1]) for _ in range(3)]
    for g in groups:
        g.behaviour_logprobs = [_logprobs_at(model, np.asarray(g.prompt_ids), c, temperature) for c in g.completions]
    at_t = FTISTrainer(model, TrainingConfig(lr=1e-3), PAD, "cpu", temperature=temperature)
    for g, lps in zip(groups, at_t.completion_logprobs(groups), strict=True):
        for lp, beh in zip(lps, g.behaviour_logprobs, strict=True):
            np.testing.assert_allclose(lp, beh, atol=1e-5)
    res = at_t.step(groups)
    assert res.mean_ratio_local == pytest.approx(1.0, abs=1e-5)
    at_one = FTISTrainer(tiny_llama(11), TrainingConfig(lr=1e-3), PAD, "cpu")
    assert abs(at_one.step(groups).mean_ratio_local - 1.0) > 1e-2
