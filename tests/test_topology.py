"""Graphs, Metropolis-Hastings mixing matrices and spectral gaps (swarm_node.dpo.topology)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from swarm_node.dpo import topology as T


@pytest.mark.parametrize("graph", T.GRAPHS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8, 9, 12, 16])
def test_mixing_matrix_is_symmetric_doubly_stochastic_nonnegative(graph: str, n: int) -> None:
    w = T.mixing_matrix(graph, n, p=0.5, seed=3)
    assert w.shape == (n, n)
    assert np.allclose(w, w.T)
    assert np.all(w >= -1e-12)
    assert np.allclose(w.sum(axis=0), 1.0)
    assert np.allclose(w.sum(axis=1), 1.0)
    a = T.adjacency(graph, n, p=0.5, seed=3)
    assert not a.diagonal().any()
    assert T.is_connected(a)
    assert 0.0 <= T.spectral_gap(w) <= 1.0 + 1e-12


def test_known_spectral_gaps() -> None:
    # complete K_n: MH weights are 1/n everywhere -> W = J/n, rho = 0.
    for n in (2, 3, 5, 8):
        w = T.mixing_matrix("complete", n)
        assert np.allclose(w, np.full((n, n), 1.0 / n))
        assert T.spectral_gap(w) == pytest.approx(1.0)
    # ring n=4: W = I/3 + A/3, eigenvalues 1/3 + 2/3 cos(2 pi k / 4) = 1, 1/3, -1/3, 1/3 -> rho = 1/3.
    assert T.spectral_gap(T.mixing_matrix("ring", 4)) == pytest.approx(2.0 / 3.0)
    # path n=3: [[2/3,1/3,0],[1/3,1/3,1/3],[0,1/3,2/3]], eigenvalues 1, 2/3, 0 -> rho = 2/3.
    w = T.mixing_matrix("path", 3)
    assert np.allclose(w, np.array([[2, 1, 0], [1, 1, 1], [0, 1, 2]]) / 3.0)
    assert T.spectral_gap(w) == pytest.approx(1.0 / 3.0)
    assert T.spectral_gap_squared_form(w) == pytest.approx(5.0 / 9.0)
    # star n=5 (research/ddpo.md table): rho = 0.8 -> 1 - rho^2 = 0.36; ring n=5: 1 - rho^2 = 0.7091.
    assert T.spectral_gap_squared_form(T.mixing_matrix("star", 5)) == pytest.approx(0.36)
    assert T.spectral_gap_squared_form(T.mixing_matrix("ring", 5)) == pytest.approx(0.7091, abs=1e-4)
    assert T.spectral_gap_squared_form(T.mixing_matrix("path", 5)) == pytest.approx(0.2384, abs=1e-4)


def test_gap_ordering_on_16_nodes() -> None:
    gaps = {g: T.spectral_gap(T.mixing_matrix(g, 16)) for g in ("path", "ring", "torus", "exponential", "complete")}
    assert gaps["path"] < gaps["ring"] < gaps["torus"] < gaps["exponential"] < gaps["complete"]


def test_torus_is_most_square() -> None:
    assert T.torus_shape(12) == (3, 4)
    assert T.torus_shape(16) == (4, 4)
    assert T.torus_shape(7) == (1, 7)
    assert T.adjacency("torus", 16).sum(axis=1).tolist() == [4] * 16
    assert np.array_equal(T.adjacency("torus", 7), T.adjacency("ring", 7))


def test_exponential_degrees() -> None:
    a = T.adjacency("exponential", 8)  # offsets +-1, +-2, +-4 -> 5 distinct neighbours
    assert a.sum(axis=1).tolist() == [5] * 8
    assert a[0, 1] and a[0, 7] and a[0, 2] and a[0, 6] and a[0, 4] and not a[0, 3]


def test_erdos_renyi_connected_and_reproducible() -> None:
    for seed in range(20):
        a = T.erdos_renyi(10, p=0.2, seed=seed)
        assert T.is_connected(a)
        assert np.array_equal(a, T.erdos_renyi(10, p=0.2, seed=seed))
    assert not all(np.array_equal(T.erdos_renyi(10, 0.3, seed=0), T.erdos_renyi(10, 0.3, seed=s)) for s in range(1, 5))


def test_live_subgraph_reweighting_stays_doubly_stochastic() -> None:
    a = T.adjacency("ring", 6)
    a[2, :] = a[:, 2] = False  # node 2 is gone: its neighbours re-weight
    w = T.mixing_matrix_from_adjacency(a)
    assert np.allclose(w.sum(axis=0), 1.0) and np.allclose(w.sum(axis=1), 1.0) and np.allclose(w, w.T)
    assert w[2, 2] == 1.0 and w[1, 1] == pytest.approx(1 - 1 / 3)


def test_neighbours_for_is_order_independent() -> None:
    ids = [f"peer{c}" for c in "qwertyuiop"]
    for graph in T.GRAPHS:
        views = []
        for trial in range(5):
            shuffled = ids[:]
            random.Random(trial).shuffle(shuffled)
            views.append({me: T.neighbours_for(shuffled, me, graph, p=0.4, seed=1) for me in ids})
        assert all(v == views[0] for v in views)
        for me, nbrs in views[0].items():  # symmetric
            assert me not in nbrs
            assert all(me in views[0][j] for j in nbrs)
    assert T.neighbours_for(["b", "c"], "a", "ring") == ["b", "c"]


@pytest.mark.parametrize("graph", T.GRAPHS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 16])
def test_widening_keeps_every_link_and_gives_each_node_enough_neighbours(graph: str, n: int) -> None:
    a = T.adjacency(graph, n, p=0.3, seed=1)
    w = T.widen(a, 3)
    assert np.array_equal(w, w.T) and not w.diagonal().any()
    assert (w | a).sum() == w.sum()  # nothing removed
    assert (w.sum(axis=1) >= min(3, n - 1)).all()
    assert np.array_equal(T.widen(a, 0), a)


def test_a_ring_widens_to_its_second_neighbours_and_others_stay() -> None:
    w = T.widen(T.ring(8), 3)
    assert [set(np.flatnonzero(w[i]).tolist()) for i in (0, 5)] == [{1, 2, 6, 7}, {3, 4, 6, 7}]
    assert np.array_equal(T.widen(T.exponential(8), 3), T.exponential(8))  # degree 5
    assert np.array_equal(T.widen(T.ring(4), 3), T.complete(4))


def test_the_gossip_plan_is_widened_under_the_clipped_rule_only() -> None:
    from swarm_node.config import DPOConfig
    from swarm_node.dpo.neighbours import plan_round

    ids = [f"p{i}" for i in range(8)]
    clipped = plan_round(DPOConfig(aggregation="clipped"), ids, "p0", 0)
    assert clipped.to_fetch == ["p1", "p2", "p6", "p7"]
    assert plan_round(DPOConfig(aggregation="mean"), ids, "p0", 0).to_fetch == ["p1", "p7"]
    assert plan_round(DPOConfig(aggregation="clipped", min_neighbours=0), ids, "p0", 0).to_fetch == ["p1", "p7"]
