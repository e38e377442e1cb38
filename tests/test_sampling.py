"""Sampled membership's pure policy (swarm/sampling.py): levels, the bounded view, push targets, and the
contact-based rejoin tick (swarm/rejoin.py).

The level test simulates whole swarms without a network: every peer writes its record to its shards at
level-1..level+1 and reads one random shard at its own level (or a probe), exactly as a node's heartbeat does;
per synchronous round, a fraction of the peers read (half, unless a test says otherwise)."""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm_node.swarm import sampling as S
from swarm_node.swarm.rejoin import RejoinPolicy


def _tops(n: int, rng: random.Random) -> np.ndarray:
    """The top 32 bits of sha256(peer id) for n synthetic peers: shard_of at every level, vectorized."""
    ids = [f"peer{rng.getrandbits(64):x}" for _ in range(n)]
    return np.array([int.from_bytes(hashlib.sha256(i.encode()).digest()[:4], "big") for i in ids], dtype=np.uint64)


def _simulate(top: np.ndarray, policies: list[S.LevelPolicy], rounds: int, rng: random.Random,
              readers: float = 0.5) -> np.ndarray:
    n = len(top)
    for _ in range(rounds):
        levels = np.array([p.level for p in policies])
        # writers[l][d]: per shard at level l, the writers at level l+1, l, l-1 (d = 0, 1, 2) who write there
        writers = {}
        for lv in range(S.MAX_LEVEL + 1):
            shard = (top >> np.uint64(32 - lv)) if lv else np.zeros(n, dtype=np.uint64)
            writers[lv] = [np.bincount(shard[levels == lv + d].astype(np.int64), minlength=2**lv) for d in (1, 0, -1)]
        for i in rng.sample(range(n), max(1, int(n * readers))):
            p = policies[i]
            x = p.read_level(rng)
            s = rng.randrange(2**x)
            deeper, same, shallower = (int(w[s]) for w in writers[x])
            p.observe(deeper + same + shallower, [x + 1] * deeper + [x] * same + [x - 1] * shallower, x)
    return np.array([p.level for p in policies])


def _within_one(levels: np.ndarray, n: int) -> float:
    return float(np.mean(np.abs(levels - math.log2(n / S.SHARD_TARGET)) <= 1.0))


def _converges_then_recovers(n: int, rounds: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    top = _tops(n, rng)
    # joiners guess from a DHT size estimate that may be 2x low or 8x high (shared DHTs over-estimate)
    policies = [S.LevelPolicy(S.initial_level(n * rng.uniform(0.5, 8.0))) for _ in range(n)]
    levels = _simulate(top, policies, rounds, rng)
    assert _within_one(levels, n) >= 0.95, np.bincount(levels)
    assert abs(float(np.median(levels)) - math.log2(n / S.SHARD_TARGET)) <= 1.0
    half = n // 2  # half the swarm leaves at once
    levels = _simulate(top[:half], policies[:half], rounds, rng)
    assert _within_one(levels, half) >= 0.95, np.bincount(levels)
    assert abs(float(np.median(levels)) - math.log2(half / S.SHARD_TARGET)) <= 1.0


@pytest.mark.parametrize("n", [10, 100, 1_000, 10_000])
def test_levels_converge_near_log2_n_over_m_and_recover_when_half_leave(n) -> None:
    _converges_then_recovers(n, rounds=30)


@pytest.mark.slow
def test_levels_converge_at_100k_peers() -> None:
    _converges_then_recovers(100_000, rounds=12)


def test_a_swarm_that_all_sits_too_shallow_moves_deeper_one_node_at_a_time() -> None:
    """Reads are spread over the heartbeat, so nodes move one by one. Without the count proviso on the majority
    rule, the first node to go deeper reads the others as a majority one level up and steps straight back:
    a 4,000-peer swarm started at level 3, 2% of it reading per round, had 0.03% of its peers within one
    level of log2(N/M) after 300 rounds (median level 6), against 60% with it (median 8, the ideal 9)."""
    rng = random.Random(3)
    n = 4_000
    policies = [S.LevelPolicy(3) for _ in range(n)]
    levels = _simulate(_tops(n, rng), policies, 300, rng, readers=0.02)
    assert _within_one(levels, n) >= 0.5, np.bincount(levels)
    assert abs(float(np.median(levels)) - math.log2(n / S.SHARD_TARGET)) <= 1.0


def test_a_partition_two_levels_above_the_swarm_finds_it_by_probing() -> None:
    """A group far shallower than every writer reads only itself; probes bring it back."""
    rng = random.Random(4)
    n = 2_000
    ideal = round(math.log2(n / S.SHARD_TARGET))
    policies = [S.LevelPolicy(ideal) for _ in range(n - 40)] + [S.LevelPolicy(0) for _ in range(40)]
    levels = _simulate(_tops(n, rng), policies, 60, rng)
    assert np.sum(levels[-40:] <= ideal - 2) <= 10, levels[-40:]


def test_initial_level_and_the_three_write_levels() -> None:
    assert S.initial_level(0) == S.initial_level(5) == S.initial_level(float("nan")) == 0
    assert S.initial_level(S.SHARD_TARGET * 2**10) == 10
    assert S.initial_level(1e30) == S.MAX_LEVEL
    keys = S.write_keys("sw", "peerA", 5)
    assert keys == [S.shard_key("sw", lv, S.shard_of("peerA", lv)) for lv in (4, 5, 6)]
    assert len(S.write_keys("sw", "peerA", 0)) == 2 and len(S.write_keys("sw", "peerA", S.MAX_LEVEL)) == 2


def test_size_estimate_is_a_smoothed_entries_times_two_to_the_level() -> None:
    p = S.LevelPolicy(4)
    assert p.size_estimate() == 0.0
    p.observe(10, [4] * 10)
    assert p.size_estimate() == 160.0
    p.observe(6, [4] * 6)
    assert p.size_estimate() == pytest.approx(160.0 + p.smoothing * (96.0 - 160.0))


def test_level_rules_in_order() -> None:
    m = S.SHARD_TARGET
    assert S.LevelPolicy(5).observe(m, [6] * m) == 6  # writers deeper, count allows: follow
    assert S.LevelPolicy(5).observe(m - 1, [6] * (m - 1)) == 5  # ...count does not: stay
    assert S.LevelPolicy(5).observe(m, [4] * m) == 4  # writers shallower
    assert S.LevelPolicy(5).observe(2 * m + 1, [5] * (2 * m + 1)) == 6  # crowded: deeper
    assert S.LevelPolicy(5).observe(m // 2 - 1, [5] * (m // 2 - 1)) == 4  # sparse: shallower
    assert S.LevelPolicy(5).observe(0, []) == 4
    assert S.LevelPolicy(5).observe(2, [6, 6]) == 5  # sparse, but its writers sit deeper: stay
    assert S.LevelPolicy(0).observe(0, []) == 0
    assert S.LevelPolicy(S.MAX_LEVEL).observe(100, [S.MAX_LEVEL] * 100) == S.MAX_LEVEL


# ---- the view ----


def test_the_view_is_bounded_and_evicts_its_oldest_stranger_first() -> None:
    v = S.ViewBook(capacity=3, ttl_s=60.0)
    assert v.add("est", "r", updated=0.0, now=0.0, rank=0)
    assert v.add("old-stranger", "r", updated=1.0, now=1.0)
    assert v.add("new-stranger", "r", updated=5.0, now=5.0)
    assert v.add("joiner", "r", updated=6.0, now=6.0)  # full: the oldest stranger goes, not the older rank 0
    assert sorted(v.peers()) == ["est", "joiner", "new-stranger"] and len(v) == 3
    v.touch("new-stranger", now=7.0)  # contact counts as fresh: "joiner" (6.0) is now the oldest stranger
    assert v.add("late", "r", updated=8.0, now=8.0)
    assert sorted(v.peers()) == ["est", "late", "new-stranger"]


def test_a_view_of_established_and_warming_peers_refuses_newcomers() -> None:
    v = S.ViewBook(capacity=2, ttl_s=60.0)
    assert v.add("a", "r", 0.0, 0.0, rank=0) and v.add("b", "r", 0.0, 0.0, rank=1)
    assert v.add("c", "r", 1.0, 1.0) is False
    assert sorted(v.peers()) == ["a", "b"]
    assert v.add("a", "r2", 2.0, 2.0, rank=0) and v.record("a") == "r2"  # listed peers still update
    assert v.add("a", "stale", 1.5, 3.0, rank=0) and v.record("a") == "r2"  # ...never to an older record


def test_view_entries_expire_unless_a_push_went_either_way() -> None:
    v = S.ViewBook(capacity=8, ttl_s=60.0)
    v.add("quiet", "r", updated=0.0, now=0.0, rank=0)
    v.add("mutual", "r", updated=0.0, now=0.0, rank=0)
    v.touch("mutual", now=50.0)
    assert v.expire(now=60.0) == []
    assert v.expire(now=60.5) == ["quiet"]
    assert v.expire(now=110.0) == [] and "mutual" in v
    assert v.expire(now=110.5) == ["mutual"] and len(v) == 0
    assert v.add("dead", "r", updated=0.0, now=61.0) is False  # a record already past its ttl is not taken


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2), st.floats(0, 100)), max_size=120),
       st.integers(1, 10))
def test_the_view_never_exceeds_its_capacity_nor_evicts_rank_0_or_1(adds, capacity) -> None:
    v = S.ViewBook(capacity=capacity, ttl_s=1e9)
    kept_ranks: dict[str, int] = {}
    for pid, rank, t in adds:
        name = f"p{pid}"
        if v.add(name, None, t, 0.0, rank):
            kept_ranks[name] = rank
        assert len(v) <= capacity
        for other, r in kept_ranks.items():
            if r < 2:
                assert other in v  # established and warming peers are never evicted


# ---- push targets ----


def test_targets_go_by_rank_plus_one_exploration_slot() -> None:
    ranks = {"e1": 0, "e2": 0, "e3": 0, "w1": 1, "s1": 2, "s2": 2}
    for seed in range(50):
        picked = S.pick_targets(list(ranks), ranks.__getitem__, 3, random.Random(seed))
        assert len(picked) == len(set(picked)) == 3
        assert all(ranks[p] == 0 for p in picked[:2])  # fanout-1 slots from rank 0 first
        assert ranks[picked[2]] >= 1  # the exploration slot: warming or stranger
    explored = {S.pick_targets(list(ranks), ranks.__getitem__, 3, random.Random(s))[2] for s in range(200)}
    assert explored == {"w1", "s1", "s2"}  # random within ranks 1-2


def test_targets_fall_back_when_ranks_are_missing() -> None:
    only_established = {f"e{i}": 0 for i in range(5)}
    picked = S.pick_targets(list(only_established), only_established.__getitem__, 3, random.Random(0))
    assert len(set(picked)) == 3  # exploration falls back to rank 0
    mixed = {"w": 1, "s": 2, "t": 2, "e": 0}
    picked = S.pick_targets(list(mixed), mixed.__getitem__, 3, random.Random(0))
    assert picked[:2] == ["e", "w"]  # rank 0, then rank 1
    assert sorted(S.pick_targets(["a", "b", "a"], lambda p: 2, 3, random.Random(0))) == ["a", "b"]
    assert S.pick_targets(["a", "b"], lambda p: 0, 0, random.Random(0)) == []


# ---- rejoin in sampled mode ----


def test_rejoin_asks_after_three_beats_without_contact_then_every_beat() -> None:
    r = RejoinPolicy()
    for beat in range(2):
        r.contact(False)
        assert not r.due(beat * 5.0)
    r.contact(True)  # contact resets the count
    answers = []
    for beat in range(2, 8):
        r.contact(False)
        answers.append(r.due(beat * 5.0 + 0.01 * beat))  # heartbeats jitter: still once a beat
    assert answers == [False, False, True, True, True, True]
    r.contact(True)
    assert not r.due(100.0)


def test_rejoin_in_full_mode_keeps_its_read_count_and_timer() -> None:
    r = RejoinPolicy()
    for _ in range(3):
        r.read(others_listed=False)
    assert r.due(0.0) and not r.due(4.9) and r.due(5.0)
    r.read(others_listed=True)
    assert not r.due(20.0)
