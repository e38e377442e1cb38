"""Robust DPO averaging (dpo/robust.py) against hostile neighbours, through the real codec and gossip_step.

Parameter-space tests first (no model: fast), then one swarm of tiny models that learns beside a hostile
neighbour (tooling/dpo_adversary.py) with the robust rule and does not with plain averaging.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from swarm_node import dpo as A
from swarm_node.config import DPOConfig, load_config
from swarm_node.dpo import robust as R
from swarm_node.dpo import topology as T
from swarm_node.errors import ConfigError
from swarm_node.swarm.averaging.reasons import PARAM_REASONS
from tooling.dpo_swarm import FakeDPOSwarm

FP = "r" * 16
ROOT = Path(__file__).resolve().parents[1]


def _states(n: int, seed: int = 0, spread: float = 1.0) -> list[list[torch.Tensor]]:
    """n nodes' parameters: a common base plus `spread` times a random offset each (spread 1: far apart)."""
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(6, 4, generator=g), torch.randn(9, generator=g)]
    return [[b + spread * torch.randn(b.shape, generator=g) for b in base] for _ in range(n)]


def _walk(states: list[list[torch.Tensor]], g: torch.Generator, size: float = 0.05) -> list[list[torch.Tensor]]:
    """Every node takes a local step of its own (random, of about `size` per entry)."""
    return [[t + size * torch.randn(t.shape, generator=g) for t in s] for s in states]


def _shapes(s):
    return [t.shape for t in s]


def _step(me: str, blobs: dict, ids: list[str], graph: str, robust, rejects=None, comp: str = "none"):
    shapes = [torch.Size([6, 4]), torch.Size([9])]
    return A.gossip_step(me, blobs[me], blobs, ids, T.adjacency(graph, len(ids)), shapes, FP, comp,
                         rejects if rejects is not None else A.RejectCounter(), robust=robust)


def _enc(s, comp: str = "none") -> bytes:
    return A.encode_params(s, FP, comp)


def _dist(a, b) -> float:
    return R.distance(a, b)


def test_plain_averaging_is_the_default_and_robust_a_setting() -> None:
    assert DPOConfig().aggregation == "mean" and R.RobustAverager.from_config(DPOConfig()) is None
    assert isinstance(R.RobustAverager.from_config(DPOConfig(aggregation="clipped")), R.RobustAverager)
    # hivemind's all-reduce averages whatever each participant sends: it cannot be clipped
    with pytest.raises(ConfigError, match="cannot clip"):
        load_config(None, ["mode=dpo", "dpo.averaging=federated", "dpo.federated_backend=allreduce",
                           "dpo.aggregation=clipped"])
    cfg = load_config(None, ["mode=dpo", "dpo.averaging=federated", "dpo.federated_backend=allreduce"])
    assert cfg.dpo.federated_backend == "allreduce"
    assert load_config(None, ["mode=dpo", "dpo.averaging=federated"]).dpo.federated_backend == "published"


def test_every_refusal_reason_is_registered_and_exported() -> None:
    from swarm_node.node import reasons

    raised = set()
    for f in [*(ROOT / "swarm_node" / "swarm" / "averaging").glob("*.py"), *(ROOT / "swarm_node" / "dpo").glob("*.py")]:
        raised |= set(re.findall(r'PayloadError\(\s*"(\w+)"', f.read_text()))
    assert {"norm_outlier", "replayed", "not_finite", "wrong_shape", "bad_encoding"} <= raised
    assert raised <= set(PARAM_REASONS), raised - set(PARAM_REASONS)
    assert all(reasons.known(f"params:{r}") for r in PARAM_REASONS)  # counted and exported as params:<reason>
    with pytest.raises(AssertionError, match="unknown"):
        A.PayloadError("made_up_by_a_peer", "x")


def test_a_hostile_neighbour_is_clipped_before_any_history_even_with_huge_values() -> None:
    """Round 0, no history: the farthest neighbour (1e38 in every entry, finite float32) is pulled in to
    the other neighbour's distance, so it moves us by at most its weight times that distance."""
    ids = ["a", "b", "c"]
    a, b, _ = _states(3)
    c = [torch.full_like(t, 1e38) for t in a]
    blobs = {"a": _enc(a), "b": _enc(b), "c": _enc(c)}
    res = _step("a", blobs, ids, "ring", R.RobustAverager())
    assert res.clipped == ["c"] and res.clip_radius == pytest.approx(_dist(a, b), rel=1e-6)
    assert all(torch.isfinite(t).all() for t in res.params)
    w = res.weights
    without_c = [w["a"] * x + w["b"] * y + w["c"] * x for x, y in zip(a, b, strict=True)]  # c's slot at our own
    assert _dist(res.params, without_c) <= w["c"] * _dist(a, b) * (1 + 1e-5)
    plain = _step("a", blobs, ids, "ring", None)
    assert _dist(plain.params, without_c) > 1e30  # what plain averaging does with it
    # pulling in a neighbour at +3e38 towards a centre at -3e38 must not overflow float32 on the way
    assert torch.equal(R.clip_towards([torch.full((3,), -3e38)], [torch.full((3,), 3e38)], 0.5)[0], torch.zeros(3))


def test_scaled_parameters_are_refused_once_the_history_is_warm() -> None:
    ids = ["a", "b", "c"]
    robust, rejects = R.RobustAverager(), A.RejectCounter()
    g = torch.Generator().manual_seed(1)
    a, b, c = _states(3, spread=0.1)
    outcomes = []
    for _ in range(6):
        a, b, c = _walk([a, b, c], g)  # every node changes every round
        blobs = {"a": _enc(a), "b": _enc(b), "c": _enc([t * 1e3 for t in c])}
        res = _step("a", blobs, ids, "ring", robust, rejects)
        outcomes.append("refused" if "c" in res.missing else "clipped" if "c" in res.clipped else "taken")
        assert "b" in res.present
        a = res.params
    # round 0 knows no scale yet (clipped); from round 1 our own update is one: refused
    assert outcomes[0] == "clipped" and set(outcomes[1:]) == {"refused"}, outcomes
    assert rejects.counts["norm_outlier"] == 5
    assert res.present == ["b"] and res.weights.keys() == {"a", "b"}  # re-weighted without it


def _learning_pair(seed: int, rounds: int, robust, rejects, hostile, warm: int = 0):
    """Two honest ring nodes a (us) and b learn (a common drift plus noise each round) and average; the
    third slot, c, sends hostile(b's parameters, x0). Starts from x0 after `warm` rounds of learning that
    the robust rule did not see. Yields each round's result and the parameters c sent."""
    g = torch.Generator().manual_seed(seed)
    x0 = _states(1, spread=0.0)[0]
    drift = [0.02 * torch.randn(t.shape, generator=g) for t in x0]
    a, b = [t.clone() for t in x0], [t.clone() for t in x0]
    for _ in range(warm):
        a = b = [t + d for t, d in zip(a, drift, strict=True)]
    robust.averaged(a)  # as DPONode does: our first update is measured from where we start
    for _ in range(rounds):
        a, b = ([t + d for t, d in zip(s, drift, strict=True)] for s in _walk([a, b], g))
        c = hostile(b, x0)
        res = _step("a", {"a": _enc(a), "b": _enc(b), "c": _enc(c)}, ["a", "b", "c"], "ring", robust, rejects)
        assert "b" in res.present  # the honest neighbour is never refused
        yield res, a, b, c
        a = res.params
        b = [(x + y) / 2 for x, y in zip(a, b, strict=True)]  # b averaged with us too


def _sign_flip(b, x0):
    return [2 * z - t for z, t in zip(x0, b, strict=True)]


def test_a_sign_flipping_neighbour_first_seen_far_away_is_refused_every_round() -> None:
    """Seen first once the swarm has learnt something (20 rounds of drift), the sign flip of an
    honest-looking copy about the shared start, x0 - (x - x0), is far outside the typical difference
    from our own first update on, and has no history of its own that could excuse it: refused every
    round, counted."""
    robust, rejects = R.RobustAverager(), A.RejectCounter()
    outcomes = ["refused" if "c" in res.missing else "kept"
                for res, *_ in _learning_pair(4, 20, robust, rejects, _sign_flip, warm=20)]
    assert outcomes == ["refused"] * 20 and rejects.counts == {"norm_outlier": 20}


def test_a_sign_flipping_neighbour_that_starts_next_to_us_is_clipped_then_refused() -> None:
    """Seen from the start, the sign flip is next to us (x = x0) and moves away as the swarm learns: at
    first it is clipped to the radius (it moves us by at most its weight times the radius); once it is
    `outlier_factor` (3) typical differences away it is refused every round, before it has been accepted
    in the PEER_TRUST (32) rounds after which its own history could excuse it (test_an_honest_neighbour_
    that_stays_put_while_the_rest_converge_is_never_refused). The honest neighbour is never refused."""
    robust, rejects = R.RobustAverager(), A.RejectCounter()
    outcomes = []
    for res, a, b, _c in _learning_pair(4, 40, robust, rejects, _sign_flip):
        outcomes.append("refused" if "c" in res.missing else "clipped" if "c" in res.clipped else "taken")
        if "c" in res.clipped:
            w = res.weights
            without_c = [w["a"] * x + w["b"] * y + w["c"] * x for x, y in zip(a, b, strict=True)]
            assert _dist(res.params, without_c) <= w["c"] * res.clip_radius * (1 + 1e-5)
    first = outcomes.index("refused") if "refused" in outcomes else len(outcomes)
    assert first <= 20 and set(outcomes[first:]) == {"refused"}, outcomes
    assert set(outcomes[1:first]) == {"clipped"} and rejects.counts == {"norm_outlier": 40 - first}, outcomes


def _converging_trio_and_a_straggler(rounds: int, offset: float, jump_at: int | None = None):
    """We (a) and two neighbours b, c converge (steps shrinking 5% a round); d, whose data no one else
    holds, stays `offset` away from us along one direction (times 10 from round `jump_at` on). The
    complete graph of 4; yields each round's result."""
    g = torch.Generator().manual_seed(7)
    ids = ["a", "b", "c", "d"]
    robust, rejects = R.RobustAverager(), A.RejectCounter()
    a = _states(1)[0]
    robust.averaged(a)
    u = [torch.randn(t.shape, generator=g) for t in a]
    u = [t / _dist(u, [torch.zeros_like(x) for x in u]) for t in u]
    for r in range(rounds):
        size = 0.05 * 0.95 ** r
        a, b, c = _walk([a, a, a], g, size)
        k = offset * (10 if jump_at is not None and r >= jump_at else 1)
        d = [t + k * e for t, e in zip(a, u, strict=True)]
        blobs = {"a": _enc(a), "b": _enc(b), "c": _enc(c), "d": _enc(d)}
        res = A.gossip_step("a", blobs["a"], blobs, ids, T.adjacency("complete", 4), _shapes(a), FP, "none",
                            rejects, robust=robust)
        yield res, rejects
        a = res.params


def test_an_honest_neighbour_that_stays_put_while_the_rest_converge_is_never_refused() -> None:
    """The typical difference shrinks as a swarm converges; a neighbour holding data no one else holds
    stays about one of its own steps away. Judged against the typical difference alone (the rule before
    2026-12-06) it was refused once that fell under a third of its distance, and cut off for good
    (benchmarks/dpo_byzantine.py: the others lost its user). Judged against its own history too, it is
    kept, clipped to the radius, once it has been accepted for PEER_TRUST (32) rounds."""
    offset = 0.5
    for res, rejects in _converging_trio_and_a_straggler(80, offset):
        assert "d" in res.present, rejects.counts
    assert res.clip_radius * R.RobustAverager().outlier_factor < offset  # the old rule would refuse it
    assert res.clipped == ["d"] and not rejects.counts


def test_a_neighbour_that_jumps_far_outside_its_own_history_is_refused() -> None:
    """The straggler's record excuses where it has been, not a jump to 10 times as far."""
    outcomes = []
    for res, rejects in _converging_trio_and_a_straggler(60, 0.5, jump_at=50):  # noqa: B007 (the last is read below)
        outcomes.append("refused" if "d" in res.missing else "kept")
    assert outcomes == ["kept"] * 50 + ["refused"] * 10 and rejects.counts == {"norm_outlier": 10}


def test_a_node_far_from_all_its_neighbours_accepts_the_honest_ones() -> None:
    """A node that joins late from the initial model (or restarts from an old checkpoint) is far from a
    swarm that has learnt: its own steps are small, it has no history, and judged by them alone it
    refused every neighbour, every round, and stayed where it was. The lower median of a round's
    differences is a floor of the typical one: it takes its two honest neighbours and catches up, and
    still refuses the third, which sends their parameters x 1e3."""
    g = torch.Generator().manual_seed(0)
    x0 = _states(1, spread=0.0)[0]
    swarm = [t + 0.4 * torch.randn(t.shape, generator=g) for t in x0]  # where the others have got to
    ids, shapes = ["a", "b", "c", "d"], _shapes(x0)
    robust, rejects = R.RobustAverager(), A.RejectCounter()
    a = [t.clone() for t in x0]
    robust.averaged(a)  # as DPONode does on its first round
    far = _dist(a, swarm)
    for _ in range(6):
        a, b, c = _walk([a, swarm, swarm], g, 0.01)
        blobs = {"a": _enc(a), "b": _enc(b), "c": _enc(c), "d": _enc([t * 1e3 for t in b])}
        res = A.gossip_step("a", blobs["a"], blobs, ids, T.adjacency("complete", 4), shapes, FP, "none",
                            rejects, robust=robust)
        assert res.present == ["b", "c"] and res.missing == ["d"], rejects.counts
        a = res.params
    assert _dist(a, swarm) < 0.1 * far and rejects.counts == {"norm_outlier": 6}


def test_replayed_bytes_are_refused() -> None:
    ids = ["a", "b", "c"]
    robust, rejects = R.RobustAverager(), A.RejectCounter()
    s0, s1 = _states(3, seed=0), _states(3, seed=1)
    first = {p: _enc(x) for p, x in zip(ids, s0, strict=True)}
    res = _step("a", first, ids, "ring", robust, rejects)
    assert not res.missing
    # next round: b replays its own payload, c echoes ours of last round back to us
    second = {"a": _enc(s1[0]), "b": first["b"], "c": first["a"]}
    res = _step("a", second, ids, "ring", robust, rejects)
    assert sorted(res.missing) == ["b", "c"] and rejects.counts["replayed"] == 2
    # the same bytes from two peers in the same round are not a replay (a copy; clipping bounds it)
    s2 = _states(3, seed=2)
    third = {"a": _enc(s2[0]), "b": _enc(s2[1]), "c": _enc(s2[1])}
    res = _step("a", third, ids, "ring", robust, rejects)
    assert not res.missing and rejects.counts["replayed"] == 2


def test_an_attacker_copying_our_parameters_back_cannot_cut_us_off() -> None:
    """The radius never falls below the typical distance once warm: a neighbour at distance 0 (our own
    parameters sent back) does not shrink it to 0, and the honest neighbour still pulls us in full."""
    ids = ["a", "b", "c"]
    robust = R.RobustAverager()
    g = torch.Generator().manual_seed(2)
    a = _states(1)[0]
    kept = []  # the share of b's pull we keep each round
    for _ in range(8):
        a, b = _walk([a, a], g)  # both step from where we are (b averaged with us last round)
        blobs = {"a": _enc(a), "b": _enc(b), "c": _enc([t + 1e-4 * torch.randn(t.shape, generator=g) for t in a])}
        res = _step("a", blobs, ids, "ring", robust)
        assert "b" in res.present
        kept.append(min(1.0, res.clip_radius / _dist(a, b)) if "b" in res.clipped else 1.0)
        a = res.params
    # round 0 has no scale yet (b is clipped to the copy's distance); then b keeps most of its pull
    assert kept[0] < 0.01 and min(kept[1:]) > 0.7 and np.mean(kept[1:]) > 0.9, kept


def test_robust_averaging_costs_little_consensus_without_an_attacker() -> None:
    n, rounds = 8, 14
    ids = [f"p{i}" for i in range(n)]
    for graph in ("ring", "exponential"):
        rho = 1.0 - T.spectral_gap(T.mixing_matrix(graph, n))
        errs = {}
        for rule in ("plain", "robust"):
            states = _states(n, seed=3)
            robust = [R.RobustAverager() if rule == "robust" else None for _ in ids]
            e = []
            for _ in range(rounds):
                mean = [torch.stack([s[k] for s in states]).mean(0) for k in range(2)]
                e.append(math.sqrt(sum(_dist(s, mean) ** 2 for s in states)))
                blobs = {p: _enc(s) for p, s in zip(ids, states, strict=True)}
                states = [_step(p, blobs, ids, graph, robust[i]).params for i, p in enumerate(ids)]
            errs[rule] = e
        late = (errs["robust"][-1] / errs["robust"][7]) ** (1 / (rounds - 8))
        assert late <= rho + 0.05, (graph, late, rho)
        assert errs["robust"][-1] <= 1.5 * errs["plain"][-1], graph


def test_coordinate_median() -> None:
    g = torch.Generator().manual_seed(4)
    for m in (3, 4, 7):
        states = [[torch.randn(5, 3, generator=g), torch.randn(11, generator=g)] for _ in range(m)]
        got = R.coordinate_median(states)
        for k in range(2):
            want = np.median(np.stack([s[k].numpy() for s in states]), axis=0)
            assert np.allclose(got[k].numpy(), want, atol=1e-6)
    huge = [[torch.full((2,), 3e38)], [torch.full((2,), 3e38)], [torch.zeros(2)], [torch.full((2,), 3e38)]]
    assert torch.equal(R.coordinate_median(huge)[0], torch.full((2,), 3e38))  # mean of the middles, no overflow


def test_robust_federated_is_bit_identical_and_bounds_a_hostile_participant() -> None:
    n = 6
    ids = [f"peer-{i}" for i in range(n)]
    states = _states(n, seed=5)
    states[0] = [t * 1e3 for t in states[0]]  # the hostile participant, first in sorted order
    blobs = {p: A.encode_params(s, FP, "float16") for p, s in zip(ids, states, strict=True)}
    shapes = _shapes(states[0])
    results = [A.federated_step(p, blobs[p], blobs, ids, shapes, FP, robust=R.RobustAverager()) for p in ids]
    assert len({A.params_digest(r.params) for r in results}) == 1
    assert all(r.clipped == ["peer-0"] for r in results)
    honest = states[1:]
    honest_mean = [torch.stack([s[k] for s in honest]).mean(0) for k in range(2)]
    spread = max(_dist(s, honest_mean) for s in honest)
    assert _dist(results[0].params, honest_mean) < spread
    plain = A.federated_step(ids[0], blobs[ids[0]], blobs, ids, shapes, FP)
    assert _dist(plain.params, honest_mean) > 50 * spread


def test_random_hostile_neighbours_never_move_us_beyond_the_radius() -> None:
    """A small fuzz of the robust path: neighbours with random finite values of random magnitude
    (1e-3 .. 1e38, some exact copies): the average stays finite, of our shapes, and within
    sum_j W_ij * radius of our own parameters whenever a radius was set."""
    rng = np.random.default_rng(0)
    shapes = [torch.Size([6, 4]), torch.Size([9])]
    for case in range(120):
        n = int(rng.integers(2, 7))
        ids = [f"p{i}" for i in range(n)]
        robust = R.RobustAverager(clip_farthest=int(rng.integers(0, 3)))
        for _round in range(3):
            states = []
            for _ in range(n):
                mag = 10.0 ** rng.uniform(-3, 38)
                states.append([torch.from_numpy((mag * rng.standard_normal(s)).clip(-3e38, 3e38).astype(np.float32))
                               for s in shapes])
            if rng.random() < 0.3:
                states[1] = [t.clone() for t in states[0]]
            blobs = {p: _enc(s) for p, s in zip(ids, states, strict=True)}
            res = A.gossip_step("p0", blobs["p0"], blobs, ids, T.adjacency("complete", n), shapes, FP, "none",
                                A.RejectCounter(), robust=robust)
            assert [t.shape for t in res.params] == shapes and all(torch.isfinite(t).all() for t in res.params)
            if res.clip_radius is not None:
                bound = sum(res.weights[p] for p in res.present) * res.clip_radius
                rounding = 1e-6 * R.distance(states[0], [torch.zeros_like(t) for t in states[0]])  # float32 sums
                assert R.distance(res.params, states[0]) <= bound * (1 + 1e-4) + rounding, (case, bound)
            assert math.isfinite(res.consensus_distance)


# ---------------------------------------------------------------- a swarm of tiny models beside an attacker


@pytest.fixture(scope="module")
def tok():
    from swarm_node.models.factory import build_tokenizer

    return build_tokenizer()


def test_a_swarm_learns_beside_a_scaling_neighbour_only_with_robust_averaging(tok) -> None:
    """6 tiny models gossiping on the exponential graph (i linked to i +- 1, i +- 2), node 0 hostile (its
    parameters x 1e3 to its 4 neighbours): with plain averaging the honest parameters blow up and accuracy is
    chance; with the robust rule the attacker is clipped in round 0, refused from round 1, and the honest
    nodes learn as well as when node 0 sends nothing at all."""
    from swarm_node.models.factory import Preset, build_model
    from swarm_node.tasks.preferences import SyntheticPreferences
    from swarm_node.training.dpo import DPOTrainer, HeldOut
    from swarm_node.training.params import trainable_named
    from tooling.dpo_adversary import HostileNeighbour, View

    torch.set_num_threads(1)
    n, rounds = 6, 12
    pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=3e-3, lr_lora=3e-3)
    task = SyntheticPreferences(4)
    ids = [f"peer-{i}" for i in range(n)]
    adj = T.adjacency("exponential", n)
    out = {}
    for rule in ("plain", "robust", "silent"):
        models = [build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, 0) for _ in range(n)]
        held = HeldOut(models[0], tok, task.heldout_pairs(120, seed=7))
        trainers = [DPOTrainer(m, tok, task.user_pairs(i % 4, 96, seed=i), lr=3e-3, batch_size=16, seed=i)
                    for i, m in enumerate(models)]
        fp = A.arch_fingerprint(models[0])
        shapes = [p.shape for _, p in trainable_named(models[0])]
        initial = A.get_params(models[0])
        hostile = HostileNeighbour("scaled")
        robust = {i: R.RobustAverager() for i in range(1, n)} if rule == "robust" else {}
        rejects = A.RejectCounter()
        for r in range(rounds):
            for t in trainers:
                t.local_steps(1)
            xs = [A.get_params(m) for m in models]
            blobs = {p: A.encode_params(x, fp, "float16") for p, x in zip(ids, xs, strict=True)}
            bad = A.encode_params(hostile.corrupt(View(r, xs[0], {}, initial)), fp, "float16")
            for i in range(1, n):
                received = {**blobs, ids[0]: None if rule == "silent" else bad}
                res = A.gossip_step(ids[i], blobs[ids[i]], received, ids, adj, shapes, fp, "float16", rejects,
                                    robust=robust.get(i))
                A.set_params(models[i], res.params)
        out[rule] = [held.evaluate(m)["heldout_pref_acc"] for m in models[1:]], dict(rejects.counts)
    plain_acc, _ = out["plain"]
    robust_acc, refused = out["robust"]
    silent_acc, _ = out["silent"]
    assert max(plain_acc) < 0.6, plain_acc
    assert np.mean(robust_acc) > np.mean(silent_acc) - 0.05 and min(robust_acc) > 0.6, (robust_acc, silent_acc)
    assert refused.get("norm_outlier", 0) == int(adj[0].sum()) * (rounds - 1)  # from round 1 on, by every neighbour


@pytest.mark.parametrize("aggregation", ["clipped", "mean"])
def test_the_dpo_node_averages_through_the_robust_rule(tok, tmp_path, aggregation: str) -> None:
    """DPONode.run_round with its one neighbour sending our parameters x 1e3: the default rule refuses it
    from round 0 (counted in the row; the node's own first update gives the scale), plain averaging takes it."""
    from swarm_node.dpo.neighbours import Neighbourhood
    from swarm_node.dpo.round import DPONode
    from swarm_node.models.factory import Preset, build_model

    torch.set_num_threads(1)
    pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=1e-3, lr_lora=1e-3)
    build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, 0).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = load_config(None, ["mode=dpo", f"model.path={tmp_path / 'm'}", "dpo.pairs_per_user=16", "dpo.heldout_pairs=16",
                             "dpo.topology=path", f"dpo.aggregation={aggregation}"])
    node = DPONode(cfg, tmp_path / "state")
    try:
        bad = [t * 1e3 for t in A.get_params(node.model)]
        payloads = {r: A.encode_params([t + 0.01 * r for t in bad], node.arch_fp, "float16") for r in range(2)}
        swarm = FakeDPOSwarm(node.arch_fp, ["them"], lambda peer, r: payloads.get(r))
        node.neighbourhood = Neighbourhood(cfg.dpo, swarm, node.arch_fp)
        rows = [node.run_round(evaluate=lambda: False) for _ in range(2)]
    finally:
        node.metrics.close()
    size = R.distance(A.get_params(node.model), [torch.zeros_like(t) for t in bad])
    if aggregation == "clipped":
        assert [r["rejected"] for r in rows] == [{"params:norm_outlier": 1}, {"params:norm_outlier": 1}]  # per round
        assert all(r["missing_neighbours"] == ["them"] and r["weights"] == {"me": 1.0} for r in rows)
        assert size < 100
    else:
        assert rows[1]["neighbours"] == ["them"] and not rows[1]["rejected"] and size > 1e3
