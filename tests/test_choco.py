"""CHOCO-Gossip's pieces: top-k keeps the largest entries, error feedback delivers the rest later, and the
compressed consensus still contracts to the average (the networked node does not use it; the DPO topology
benchmark compares it with plain averaging)."""

from __future__ import annotations

import numpy as np
import torch

from swarm_node.dpo import mixing, topology
from tooling import choco


def test_top_k_keeps_the_largest_entries_as_float16():
    t = torch.tensor([[0.1, -5.0, 0.2], [3.0, 0.0, -0.4]])
    s = choco.top_k(t, fraction=0.34)  # ceil(0.34 * 6) = 3 entries
    assert sorted(s.indices.tolist()) == [1, 3, 5]
    assert s.nbytes == 3 * (choco.INDEX_BYTES + choco.VALUE_BYTES)
    torch.testing.assert_close(s.dense(), torch.tensor([[0.0, -5.0, 0.0], [3.0, 0.0, -0.4]]), atol=1e-3, rtol=0)


def test_error_feedback_delivers_what_compression_dropped():
    """A fixed x sent 10% at a time: the public copy reaches x, because each round sends what is still missing."""
    torch.manual_seed(0)
    x = [torch.randn(50), torch.randn(4, 5)]
    public = [torch.zeros_like(t) for t in x]
    for _ in range(12):
        public = choco.apply(public, choco.compress(x, public, fraction=0.1))
    assert max(float((p - t).abs().max()) for p, t in zip(public, x, strict=True)) < 1e-2


def test_compressed_consensus_contracts_to_the_average():
    """8 nodes on a ring, no training: CHOCO with 20% top-k shrinks the consensus error and keeps the mean."""
    rng = np.random.default_rng(1)
    ids = [f"p{i}" for i in range(8)]
    adj = topology.adjacency("ring", 8)
    xs = [[torch.tensor(rng.standard_normal(30), dtype=torch.float32)] for _ in ids]
    mean0 = torch.stack([x[0] for x in xs]).mean(0)
    public = [[torch.zeros(30)] for _ in ids]

    def err(states) -> float:
        m = torch.stack([s[0] for s in states]).mean(0)
        return float(sum(((s[0] - m) ** 2).sum() for s in states))

    e0 = err(xs)
    for _ in range(60):
        msgs = [choco.compress(x, h, 0.2) for x, h in zip(xs, public, strict=True)]
        public = [choco.apply(h, q) for h, q in zip(public, msgs, strict=True)]
        by_id = dict(zip(ids, public, strict=True))
        xs = [choco.consensus_step(x, public[i], by_id, mixing.live_mixing_row(adj, ids, p), p, gamma=0.4)
              for i, (p, x) in enumerate(zip(ids, xs, strict=True))]
    assert err(xs) < 1e-2 * e0
    torch.testing.assert_close(torch.stack([x[0] for x in xs]).mean(0), mean0, atol=2e-2, rtol=0)
