"""The learner's memory: chunked output-head log-probs, token-budget micro-batches, out-of-memory retries,
and mixed precision (fp32 master weights, bf16 compute)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swarm_node.config import TrainingConfig
from swarm_node.training.ftis_step import FTISTrainer
from swarm_node.training.logprobs import chunk_tokens, head_logprobs
from tests.test_grpo_step import PAD, random_group, tiny_llama, with_behaviour


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_head_logprobs_equal_one_log_softmax_values_and_gradients(temperature, chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(23, 16, requires_grad=True)
    targets = torch.randint(0, 50, (23,))
    ref = torch.log_softmax(head(hidden).float() / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    got = head_logprobs(hidden, targets, head, temperature, chunk)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
    w = torch.randn(23)
    g_ref = torch.autograd.grad((ref * w).sum(), [hidden, head.weight])
    g_got = torch.autograd.grad((got * w).sum(), [hidden, head.weight])
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_chunk_size_follows_the_vocabulary():
    assert chunk_tokens(151_936) == 220  # 128 MiB of fp32 logits
    assert chunk_tokens(49_152) == 682
    assert chunk_tokens(10**12) == 1


def _groups(rng, n=4):
    return [random_group(rng, g=4, prompt_len=int(rng.integers(2, 6)), rewards=[1, 0, 0, 1]) for _ in range(n)]


def test_micro_batches_keep_to_the_token_budget_and_the_gradient_is_unchanged():
    rng = np.random.default_rng(4)
    groups = _groups(rng)
    grads, shapes = [], []
    for budget in (10**6, 24):
        model = tiny_llama(7)
        trainer = FTISTrainer(model, TrainingConfig(micro_batch_tokens=budget, lr=1e-3), PAD, "cpu")
        with_behaviour(trainer, groups, shift=-0.1)
        batch = trainer.prepare(groups)
        mbs = trainer._micro_batches(len(batch.sequences), batch.sequences)
        for mb in mbs:  # the tokens the shared-prompt forwards run: distinct prompts + the completions' rows
            seqs = [batch.sequences[i] for i in mb]
            distinct = len({s.ids[: s.prompt_len].tobytes() for s in seqs})
            ran = distinct * max(s.prompt_len for s in seqs) + len(mb) * max(s.completion_len for s in seqs)
            assert ran <= budget or len(mb) == 1
        shapes.append(len(mbs))
        trainer.accumulate_gradients(batch)
        grads.append(torch.cat([p.grad.flatten() for p in trainer.params]))
    assert shapes[0] == 1 and shapes[1] > 3
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


class _SmallCard:
    """A model whose forwards run out of memory above `limit` input tokens, as a full card does; and, if
    `refuse_call` is set, once at that forward call whatever its size (memory taken mid-pass by another
    process, or fragmentation), after earlier micro-batches of the pass have added to the gradient."""

    def __init__(self, model, limit: int | None, refuse_call: int | None = None):
        self.model, self.limit, self.refuse_call, self.refused, self.calls = model, limit, refuse_call, 0, 0
        body = model.get_decoder()
        self._forward = body.forward
        body.forward = self._checked

    def _checked(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        self.calls += 1
        too_big = ids is not None and self.limit is not None and ids.numel() > self.limit
        if too_big or self.calls == self.refuse_call:
            self.refused += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self._forward(*args, **kwargs)


@pytest.mark.parametrize(("budget", "limit", "refuse_call"), [(4096, 40, None), (64, None, 2)],
                         ids=["too-big-for-the-card", "mid-pass"])
def test_out_of_memory_halves_the_token_budget_and_retries_with_the_same_update(budget, limit, refuse_call):
    rng = np.random.default_rng(5)
    groups = _groups(rng)
    after = []
    for simulated in (False, True):
        model = tiny_llama(8)
        # SGD, whose step is the gradient itself (Adam's first step is lr * sign(gradient), blind to a
        # gradient counted twice), and no clipping, which would hide it too
        cfg = TrainingConfig(micro_batch_tokens=budget, lr=0.5, optimizer="sgd", grad_clip=1e6)
        # one forward per micro-batch: the card sees all its tokens
        trainer = FTISTrainer(model, cfg, PAD, "cpu", share_prompts=False)
        with_behaviour(trainer, groups, shift=-0.1)
        card = _SmallCard(model, limit, refuse_call) if simulated else None
        res = trainer.step(groups)
        assert res.stepped
        if card is not None:
            assert card.refused >= 1 and res.oom_retries == card.refused
            assert res.micro_batch_tokens == trainer.token_budget < cfg.micro_batch_tokens
        else:
            assert res.oom_retries == 0 and res.micro_batch_tokens == cfg.micro_batch_tokens
        after.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    # the same update up to float summation order (smaller micro-batches add the gradient in another order:
    # CI saw 1.8e-6 on one of 20,640 weights); a micro-batch counted twice or lost moves them by far more
    torch.testing.assert_close(after[0], after[1], atol=2e-5, rtol=1e-4)


def test_out_of_memory_with_one_sequence_per_micro_batch_is_raised():
    rng = np.random.default_rng(6)
    groups = _groups(rng, 1)
    model = tiny_llama(9)
    trainer = FTISTrainer(model, TrainingConfig(lr=1e-2), PAD, "cpu", share_prompts=False)
    with_behaviour(trainer, groups)
    _SmallCard(model, 1)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.step(groups)
