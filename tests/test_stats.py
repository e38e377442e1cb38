"""The benchmarks' statistics: paired standard errors and the 'cannot tell' verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from swarm_node.runs.stats import combined_se, mean_std, paired_difference, paired_se, verdict


def test_mean_std_skips_missing_and_uses_the_sample_std():
    assert mean_std([1.0, None, 3.0]) == (2.0, pytest.approx(math.sqrt(2.0)))
    assert mean_std([0.5]) == (0.5, 0.0)
    assert all(math.isnan(x) for x in mean_std([None]))


def test_paired_se_is_smaller_than_unpaired_for_correlated_models():
    """Two models that solve mostly the same problems: pairing removes the shared problem difficulty."""
    rng = np.random.default_rng(0)
    easy = rng.random(400) < 0.4
    a = easy | (rng.random(400) < 0.05)
    b = easy | (rng.random(400) < 0.02)
    unpaired = math.sqrt(a.var(ddof=1) / 400 + b.var(ddof=1) / 400)
    assert paired_se(a, b) < 0.5 * unpaired
    with pytest.raises(ValueError):
        paired_se(a, b[:-1])


def test_verdict_needs_two_standard_errors():
    assert verdict(0.05, 0.02) == "higher" and verdict(-0.05, 0.02) == "lower"
    assert verdict(0.03, 0.02) == "cannot tell" and verdict(0.1, float("nan")) == "cannot tell"


def test_one_seed_still_gets_the_within_seed_error():
    assert combined_se([0.02], [0.05]) == pytest.approx(0.02)
    assert combined_se([0.01, 0.01], [0.0, 0.2]) == pytest.approx(0.1)  # seeds disagree: their spread wins


def test_paired_difference_compares_two_arms_seed_by_seed():
    """Arm a solves 40 more of 400 problems than arm b in each of 3 seeds: +0.1, beyond 2 SE; swapped, -0.1."""
    rng = np.random.default_rng(1)
    pairs = []
    for _ in range(3):
        b = rng.random(400) < 0.3
        a = b.copy()
        a[np.flatnonzero(~b)[:40]] = True
        pairs.append(({"acc": a.mean(), "hits": a}, {"acc": b.mean(), "hits": b}))
    d, se, v = paired_difference(pairs, "acc", "hits")
    assert d == pytest.approx(0.1) and v == "higher"
    assert se == pytest.approx(combined_se([paired_se(a["hits"], b["hits"]) for a, b in pairs], [0.1] * 3))
    assert paired_difference([(b, a) for a, b in pairs], "acc", "hits")[2] == "lower"


def test_linear_contrast_weighs_paired_runs():
    """'gain - half another gain' per problem: a end +1, a start -1/2, b end -1/2 over the same problems."""
    from swarm_node.runs.stats import linear_contrast

    rng = np.random.default_rng(2)
    seeds = []
    for _ in range(3):
        start = rng.random(300) < 0.2
        b = start.copy()
        b[np.flatnonzero(~start)[:30]] = True   # b gains 0.1
        a = start.copy()
        a[np.flatnonzero(~start)[:15]] = True   # a gains 0.05: exactly half of b's
        seeds.append([(1.0, a, a.mean()), (-0.5, start, start.mean()), (-0.5, b, b.mean())])
    d, se, v = linear_contrast(seeds)
    assert d == pytest.approx(0.0, abs=1e-12) and v == "cannot tell" and se > 0
    seeds[0][0] = (1.0, seeds[0][1][1], seeds[0][1][2])  # seed 0: a gains nothing
    assert linear_contrast(seeds)[0] == pytest.approx(-0.05 / 3)
    with pytest.raises(ValueError, match="differ in length"):
        linear_contrast([[(1.0, [True], 1.0), (-1.0, [True, False], 0.5)]])


def test_gain_with_se_pairs_per_problem_when_it_can():
    """Same problems: the paired SE; different problem counts: the unpaired one (larger here); neither: nan."""
    from swarm_node.runs.stats import gain_with_se

    a, b = "1101101100", "1001001100"  # a gets 2 more right, none fewer
    g = gain_with_se(0.6, 0.4, a, b)
    d = np.array([int(x) - int(y) for x, y in zip(a, b, strict=True)])
    assert g["paired"] and g["gain"] == pytest.approx(0.2) and g["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(10))
    u = gain_with_se(0.6, 0.4, a, b[:9], 10, 9)
    assert not u["paired"] and u["se"] == pytest.approx(np.sqrt(0.24 / 10 + 0.24 / 9)) and u["se"] > g["se"]
    assert gain_with_se(0.6, 0.4)["verdict"] == "cannot tell"
