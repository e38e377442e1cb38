"""Replays under new identities (hole 5), fabricated behaviour log-probs and Sybil shares (hole 6)."""

from __future__ import annotations

import numpy as np

from swarm_node.node.rollouts import LogprobAudit, ReplayWindow, cap_share
from swarm_node.protocol import Completion, Group, RolloutBatch, decode_batch, encode_batch
from swarm_node.training.groups import TrainGroup


def groups(seed: int, n: int = 3, g: int = 4, source: str = "peer-a") -> list[TrainGroup]:
    rng = np.random.default_rng(seed)
    return [TrainGroup(prompt_ids=rng.integers(0, 99, 5), completions=[rng.integers(0, 99, 6) for _ in range(g)],
                       behaviour_logprobs=[-rng.exponential(1.0, 6).astype(np.float32) for _ in range(g)],
                       rewards=rng.random(g).astype(np.float32), source=source) for _ in range(n)]


def reencoded(gs: list[TrainGroup], source: str) -> list[TrainGroup]:
    """What a replayer sends: the same groups through the wire under its own name (log-probs quantized)."""
    batch = RolloutBatch("s", "t", "f", "m", 1, 100, [
        Group(f"p{i}", g.prompt_ids, [Completion(c, b, 0.0) for c, b in zip(g.completions, g.behaviour_logprobs, strict=True)])
        for i, g in enumerate(gs)])
    back = decode_batch(encode_batch(batch))
    return [TrainGroup(prompt_ids=bg.prompt_ids, completions=[c.token_ids for c in bg.completions],
                       behaviour_logprobs=[c.logprobs for c in bg.completions], rewards=g.rewards, source=source)
            for bg, g in zip(back.groups, gs, strict=True)]


def test_a_batch_replayed_under_another_identity_counts_once() -> None:
    w = ReplayWindow(window=4)
    original = reencoded(groups(0), "peer-a")
    kept, rej = w.admit(5, original)
    assert len(kept) == 3 and not rej
    kept, rej = w.admit(5, reencoded(groups(0), "sybil"))  # same completions, new identity
    assert kept == [] and rej == {"duplicate_completion": 12, "replayed_group": 3}
    kept, rej = w.admit(7, reencoded(groups(0), "sybil-2"))  # two rounds later, still in the window
    assert kept == [] and rej["replayed_group"] == 3


def test_a_partial_replay_keeps_only_the_new_completions() -> None:
    w = ReplayWindow(window=4)
    w.admit(1, groups(1))
    mixed = groups(1)
    fresh = groups(2)
    for g, f in zip(mixed, fresh, strict=True):
        g.completions[:2], g.behaviour_logprobs[:2] = f.completions[:2], f.behaviour_logprobs[:2]
    kept, rej = w.admit(1, mixed)
    assert rej == {"duplicate_completion": 6} and [len(g.completions) for g in kept] == [2, 2, 2]
    assert all(len(g.rewards) == 2 for g in kept)


def test_our_own_samples_sent_back_count_once_and_the_window_expires() -> None:
    w = ReplayWindow(window=2)
    mine = groups(3, source="local")
    w.remember(10, mine)
    assert w.admit(10, reencoded(mine, "thief"))[0] == []
    assert len(w.admit(12, reencoded(mine, "thief"))[0]) == 3  # out of the window: a new round's data


def test_cap_share_bounds_one_identity() -> None:
    gs = groups(4, n=10)
    kept, dropped = cap_share(gs, 8)
    assert len(kept) == 8 and dropped == 2
    assert cap_share(gs, 20) == (gs, 0)


def _simulated_batch(rng, p_logits, q_logits, n_seq=64, length=8, delta=0.0):
    """Tokens sampled from q; claimed log-probs = log q (minus delta when fabricating); our recompute = log p."""
    logq = q_logits - np.log(np.exp(q_logits).sum(-1, keepdims=True))
    logp = p_logits - np.log(np.exp(p_logits).sum(-1, keepdims=True))
    claimed, ours = [], []
    for _ in range(n_seq):
        pos = rng.integers(0, len(q_logits), length)  # a context per token, as a stand-in for the prefix
        tok = np.argmax(logq[pos] + rng.gumbel(size=(length, q_logits.shape[1])), axis=1)  # a draw from q
        claimed.append(np.rint((logq[pos, tok] - delta) * 64) / 64)  # on the wire's grid
        ours.append(logp[pos, tok])
    g = TrainGroup(prompt_ids=np.zeros(1, np.int64), completions=[np.zeros(length, np.int64)] * n_seq,
                   behaviour_logprobs=claimed, rewards=np.zeros(n_seq, np.float32), source="peer")
    return [g], [ours]


def test_logprob_audit_passes_honest_models_and_refuses_fabrication() -> None:
    rng = np.random.default_rng(0)
    q_logits = rng.normal(0, 2.0, (16, 50))
    p_logits = q_logits + rng.normal(0, 1.5, (16, 50))  # a very different model
    audit = LogprobAudit()
    honest = [audit.judge(*_simulated_batch(rng, p_logits, q_logits)) for _ in range(40)]
    same = [audit.judge(*_simulated_batch(rng, q_logits, q_logits)) for _ in range(10)]
    faked = [audit.judge(*_simulated_batch(rng, p_logits, q_logits, delta=3.0)) for _ in range(10)]
    assert all(ok for ok, _s, _l in honest + same)
    assert max(s for _ok, s, _l in honest) < 1.0 < min(s for _ok, s, _l in faked)
    assert not any(ok for ok, _s, _l in faked)


def test_repeats_within_an_honest_group_are_kept() -> None:
    """A sampler that drew the same short answer 3 times out of 4: the group keeps all 4 (its advantages
    depend on the multiplicity); a later replay of that group is still dropped."""
    w = ReplayWindow(window=4)
    g = groups(4, n=1)[0]
    g.completions[1], g.behaviour_logprobs[1] = g.completions[0].copy(), g.behaviour_logprobs[0].copy()
    g.completions[2], g.behaviour_logprobs[2] = g.completions[0].copy(), g.behaviour_logprobs[0].copy()
    kept, rej = w.admit(3, [g])
    assert not rej and len(kept[0].completions) == 4
    kept, rej = w.admit(3, reencoded([g], "sybil"))
    assert kept == [] and rej["replayed_group"] == 1
