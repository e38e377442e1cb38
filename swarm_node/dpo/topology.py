"""Communication graphs for gossip averaging, their Metropolis-Hastings mixing matrices and spectral gaps.

Pure numpy, no networking: every node derives the same graph from the same sorted list of peer ids, so
no coordination is needed to agree on who averages with whom. The spectral gap 1 - rho (rho = the
second-largest eigenvalue modulus of W) is the per-round contraction of the consensus error:
||x - x_bar|| shrinks by at least rho each gossip step, so a larger gap means faster consensus.
"""

from __future__ import annotations

import math
from typing import get_args

import numpy as np

from swarm_node.config import Graph

GRAPHS: tuple[str, ...] = get_args(Graph)


def _empty(n: int) -> np.ndarray:
    if n < 1:
        raise ValueError(f"a graph needs at least one node, got n={n}")
    return np.zeros((n, n), dtype=bool)


def _link(a: np.ndarray, i: int, j: int) -> None:
    if i != j:
        a[i, j] = a[j, i] = True


def path(n: int) -> np.ndarray:
    a = _empty(n)
    for i in range(n - 1):
        _link(a, i, i + 1)
    return a


def ring(n: int) -> np.ndarray:
    a = path(n)
    if n > 2:
        _link(a, 0, n - 1)
    return a


def star(n: int) -> np.ndarray:
    """Node 0 is the hub."""
    a = _empty(n)
    for i in range(1, n):
        _link(a, 0, i)
    return a


def complete(n: int) -> np.ndarray:
    a = ~_empty(n)
    np.fill_diagonal(a, False)
    return a


def torus_shape(n: int) -> tuple[int, int]:
    """The most square factorisation rows * cols = n with rows <= cols (a prime n gives a 1 x n ring)."""
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return rows, n // rows


def torus(n: int) -> np.ndarray:
    """2-D torus (grid with wrap-around) on the most square rows x cols = n."""
    a = _empty(n)
    rows, cols = torus_shape(n)
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            _link(a, i, r * cols + (c + 1) % cols)
            _link(a, i, ((r + 1) % rows) * cols + c)
    return a


def exponential(n: int) -> np.ndarray:
    """Node i linked to i +- 2^k (mod n) for every 2^k < n: log-degree with a large spectral gap."""
    a = _empty(n)
    k = 1
    while k < n:
        for i in range(n):
            _link(a, i, (i + k) % n)
            _link(a, i, (i - k) % n)
        k *= 2
    return a


def is_connected(a: np.ndarray) -> bool:
    n = a.shape[0]
    seen = np.zeros(n, dtype=bool)
    seen[0] = True
    frontier = [0]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(a[i] & ~seen):
            seen[j] = True
            frontier.append(int(j))
    return bool(seen.all())


def erdos_renyi(n: int, p: float = 0.5, seed: int = 0, max_tries: int = 10_000) -> np.ndarray:
    """G(n, p) from `seed`, resampled (same rng stream) until connected, so it is reproducible."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"erdos_renyi needs 0 < p <= 1, got {p}")
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(n, k=1)
    for _ in range(max_tries):
        a = _empty(n)
        keep = rng.random(len(iu[0])) < p
        a[iu[0][keep], iu[1][keep]] = True
        a |= a.T
        if is_connected(a):
            return a
    raise ValueError(f"no connected G({n}, {p}) found in {max_tries} tries; raise the probability")


def adjacency(graph: str, n: int, **params) -> np.ndarray:
    """Boolean symmetric adjacency (no self loops) of a named graph on n nodes.

    params: `p` / `seed` for erdos_renyi (`er_probability` is accepted for `p`); others ignore params.
    """
    if graph == "path":
        return path(n)
    if graph == "ring":
        return ring(n)
    if graph == "star":
        return star(n)
    if graph == "complete":
        return complete(n)
    if graph == "torus":
        return torus(n)
    if graph == "exponential":
        return exponential(n)
    if graph == "erdos_renyi":
        p = params.get("p", params.get("er_probability", 0.5))
        return erdos_renyi(n, p=p, seed=int(params.get("seed", 0)))
    raise ValueError(f"unknown graph {graph!r}; choose one of {', '.join(GRAPHS)}")


def widen(a: np.ndarray, min_degree: int) -> np.ndarray:
    """`a` plus links from every node with fewer than `min_degree` neighbours to its neighbours' neighbours,
    repeated (from the graph of the step before, so the result is symmetric and the same on every node)
    until each such node has enough or nothing changes. A ring becomes the ring with its second neighbours.

    Why: against f hostile neighbours a node needs at least 2f + 1 of them to outvote them. With two, one
    hostile, nothing in what the two send tells which one lies (docs/dpo.md, "Robust averaging").
    """
    out = np.asarray(a, dtype=bool).copy()
    n = out.shape[0]
    while True:
        new = out.copy()
        for i in np.flatnonzero(out.sum(axis=1) < min(min_degree, n - 1)):
            reach = out[out[i]].any(axis=0)  # our neighbours' neighbours: O(degree x n), not a matrix product
            reach[i] = False
            new[i] |= reach
            new[:, i] |= reach
        if np.array_equal(new, out):
            return out
        out = new


def mixing_matrix_from_adjacency(a: np.ndarray) -> np.ndarray:
    """Metropolis-Hastings weights: W_ij = 1/(1+max(d_i,d_j)) on edges, W_ii = 1 - sum_j W_ij.

    Symmetric and doubly stochastic for any undirected graph, using only local degrees; an isolated node
    keeps W_ii = 1. Used for the full graph and for the live subgraph when neighbours go missing.
    """
    a = np.asarray(a, dtype=bool)
    a = (a | a.T) & ~np.eye(a.shape[0], dtype=bool)
    deg = a.sum(axis=1)
    w = np.where(a, 1.0 / (1.0 + np.maximum(deg[:, None], deg[None, :])), 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def mixing_matrix(graph: str, n: int, **params) -> np.ndarray:
    return mixing_matrix_from_adjacency(adjacency(graph, n, **params))


def second_eigenvalue_modulus(w: np.ndarray) -> float:
    """rho: the second-largest |eigenvalue| of a symmetric W (0 for a single node)."""
    if w.shape[0] < 2:
        return 0.0
    moduli = np.sort(np.abs(np.linalg.eigvalsh((w + w.T) / 2.0)))[::-1]
    return float(moduli[1])


def spectral_gap(w: np.ndarray) -> float:
    """1 - rho: the worst-case per-round contraction margin of the consensus error ||x - x_bar||."""
    return 1.0 - second_eigenvalue_modulus(w)


def spectral_gap_squared_form(w: np.ndarray) -> float:
    """1 - rho^2: the form the DDPO code reports (contraction of the squared consensus error)."""
    return 1.0 - second_eigenvalue_modulus(w) ** 2


def neighbours_for(peer_ids: list[str], self_id: str, graph: str, **params) -> list[str]:
    """self_id's neighbours in the graph built on the SORTED unique peer ids (self_id included).

    Every node that sees the same membership derives the same graph, whatever order it listed peers in.
    """
    ids = sorted(set(peer_ids) | {self_id})
    a = adjacency(graph, len(ids), **params)
    i = ids.index(self_id)
    return [ids[j] for j in np.flatnonzero(a[i])]
