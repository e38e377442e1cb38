"""Completions of one group that start alike: each is sent as (source, shared prefix length, new tokens).

The G completions of a prompt are sampled from the same context, so they often begin with the same
tokens, and with the same log-probs, since the same context gives the same distribution (on a trained
tiny model 40% of a group's completions are exact repeats: short answers are sampled again and again).
A completion names an earlier completion of its group (`d` back, 0 for none) and how many leading
(id, quantized log-prob) pairs it shares with it (`L`); only its other tokens travel. Matching on the
quantized pair keeps the round trip exact: the receiver copies what it already decoded.

The copied tokens are not backed by bytes of their own, so their total is bounded before anything is
expanded: every length comes from the `cl` column and their sum must pass `max_total_tokens`
(validate.check_counts), the same bound a batch sent in full has.
"""

from __future__ import annotations

import numpy as np

from .errors import ProtocolError

D_SPAN = 16  # the `cs` column holds L * D_SPAN + d, so d < D_SPAN
WINDOW = D_SPAN - 1  # earlier completions of the group compared against (G = 8-16 in practice): bounds the cost
BROADCAST_CELLS = 1 << 22  # groups up to this many (pair x position) cells are compared in one numpy call


def _group_broadcast(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(d, L) of one group by comparing every pair at once: rows padded with distinct negative values, so
    padding never matches, and the first mismatch of each pair is its common prefix length."""
    n = len(keys)
    lens = np.array([len(k) for k in keys], dtype=np.int64)
    width = int(lens.max()) + 1
    m = -np.arange(1, n + 1, dtype=np.int64)[:, None] * np.ones(width, dtype=np.int64)
    for i, k in enumerate(keys):
        m[i, : len(k)] = k
    lcp = np.argmin(m[:, None, :] == m[None, :, :], axis=2)  # a pad differs from everything: never all-equal
    i, j = np.indices((n, n))
    lcp[(j >= i) | (i - j > WINDOW)] = 0
    best = np.argmax(lcp[:, ::-1], axis=1)  # reversed: among equal prefixes the nearest (largest j) wins
    src = n - 1 - best
    shared = lcp[np.arange(n), src]
    return np.where(shared > 0, np.arange(n) - src, 0), shared


def _group_pairwise(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The same for groups too large to compare at once: pair by pair, skipping pairs whose first keys differ."""
    n = len(keys)
    d, shared = np.zeros(n, np.int64), np.zeros(n, np.int64)
    first = [int(k[0]) if len(k) else None for k in keys]
    for i in range(n):
        for j in range(i - 1, max(0, i - WINDOW) - 1, -1):
            if first[i] is None or first[i] != first[j]:
                continue
            m = min(len(keys[i]), len(keys[j]))
            diff = keys[i][:m] != keys[j][:m]
            lcp = int(np.argmax(diff)) if diff.any() else m
            if lcp > shared[i]:
                d[i], shared[i] = i - j, lcp
    return d, shared


def find_shared(keys: list[np.ndarray], group_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, L) per completion, from one int64 key per token (id << 24 | quantized log-prob): the earlier
    completion of the same group (within WINDOW) with the longest common prefix of keys, the nearest on
    ties; d = L = 0 when none shares a first token."""
    d, shared = np.zeros(len(keys), np.int64), np.zeros(len(keys), np.int64)
    start = 0
    for size in group_sizes.tolist():
        if size > 1:
            group = keys[start : start + size]
            width = max(len(k) for k in group) + 1
            fn = _group_broadcast if size * size * width <= BROADCAST_CELLS else _group_pairwise
            d[start : start + size], shared[start : start + size] = fn(group)
        start += size
    return d, shared


def check_sources(d: np.ndarray, shared: np.ndarray, lens: np.ndarray, group_sizes: np.ndarray) -> None:
    """A source must be an earlier completion of the same group (0 < d <= position in the group), its
    length at least L, and L = 0 exactly when d = 0."""
    n = len(lens)
    pos_in_group = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(group_sizes) - group_sizes, group_sizes)
    if np.any(d > pos_in_group):
        raise ProtocolError("schema", "a completion shares a prefix with one outside its group")
    if np.any((d > 0) != (shared > 0)):
        raise ProtocolError("schema", "a completion has a source without a shared prefix, or the reverse")
    if np.any(shared > lens) or np.any(shared > lens[np.arange(n, dtype=np.int64) - d]):
        raise ProtocolError("length_mismatch", "a shared prefix is longer than its completion or its source")


def expand(d: np.ndarray, shared: np.ndarray, lens: np.ndarray, n_literal: int) -> np.ndarray:
    """Positions into the stream of new tokens for every completion token (completion order), copying each
    shared prefix from its source. Sources come earlier, so one pass in order resolves chains."""
    total = int(lens.sum())
    starts = np.cumsum(lens) - lens
    pos = np.empty(total, dtype=np.int32 if n_literal < 2**31 else np.int64)
    lit = 0
    for i, (di, li, n) in enumerate(zip(d.tolist(), shared.tolist(), lens.tolist(), strict=True)):
        s = int(starts[i])
        if li:
            t = int(starts[i - di])
            pos[s : s + li] = pos[t : t + li]
        new = n - li
        pos[s + li : s + n] = np.arange(lit, lit + new)
        lit += new
    if lit != n_literal:  # literal_lengths makes these equal; kept as a guard for direct callers
        raise ProtocolError("length_mismatch", f"{lit} new tokens, the columns hold {n_literal}")
    return pos
