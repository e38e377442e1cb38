"""Routing the gossip graph around a missing or refused neighbour (dpo/bypass.py), and its use by DPONode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swarm_node import dpo as A
from swarm_node.config import DPOConfig, load_config
from swarm_node.dpo import bypass
from swarm_node.dpo import topology as T
from swarm_node.dpo.bypass import Bypass
from swarm_node.dpo.robust import RobustAverager
from tooling.dpo_adversary import HostileNeighbour, View, recipient
from tooling.dpo_swarm import FakeDPOSwarm

IDS = [f"p{i}" for i in range(8)]
FP = "b" * 16
SHAPES = [torch.Size([5, 3]), torch.Size([7])]


def _links(adj: np.ndarray, me: str) -> set[str]:
    return {IDS[j] for j in np.flatnonzero(adj[IDS.index(me)])}


def test_a_ring_node_links_past_a_neighbour_missing_bypass_after_rounds() -> None:
    ring = T.ring(8)
    b = Bypass(after=3)
    for _ in range(2):
        b.observe(present=["p2"], missing=["p0"])
    assert b.adjacency(ring, IDS, "p1") is ring and not b.routed_around()  # two rounds are not enough
    b.observe(present=["p2"], missing=["p0"])
    adj = b.adjacency(ring, IDS, "p1")
    assert b.routed_around() == {"p0"} and _links(adj, "p1") == {"p0", "p2", "p7"}
    assert adj[IDS.index("p7"), IDS.index("p1")]  # symmetric, so the MH degrees of p7 count it
    assert not ring[IDS.index("p7"), IDS.index("p1")]  # the graph every node derives is untouched
    b.observe(present=["p0", "p2"], missing=["p7"])  # p0 back: the link goes, p7 starts its own count
    assert b.adjacency(ring, IDS, "p1") is ring and b.missing_rounds == {"p7": 1}


def test_a_run_of_missing_nodes_is_crossed_one_hop_at_a_time() -> None:
    ring = T.ring(8)
    b = Bypass(after=2)
    for _ in range(2):
        b.observe(["p2"], ["p0"])
    assert _links(b.adjacency(ring, IDS, "p1"), "p1") == {"p0", "p2", "p7"}
    for _ in range(2):
        b.observe(["p2"], ["p0", "p7"])  # p7, now our neighbour, is missing too
    assert _links(b.adjacency(ring, IDS, "p1"), "p1") == {"p0", "p2", "p7", "p6"}
    assert not Bypass(after=0).routed_around()
    off = Bypass(after=0)
    for _ in range(5):
        off.observe([], ["p0"])
    assert off.adjacency(ring, IDS, "p1") is ring
    with pytest.raises(ValueError):
        Bypass(after=-1)


def _consensus_beside_a_silent_node(after: int, rounds: int = 40) -> tuple[float, float]:
    """Pure gossip averaging of random vectors on an 8-node ring whose node 0 sends nothing, through the
    real codec and gossip_step: the 7 live nodes' consensus error at the end, and how far their mean moved."""
    g = torch.Generator().manual_seed(0)
    xs = [[torch.randn(s, generator=g) for s in SHAPES] for _ in IDS]
    ring = T.ring(8)
    live = IDS[1:]
    bypass = {p: Bypass(after) for p in live}
    mean0 = [torch.stack([xs[IDS.index(p)][k] for p in live]).mean(0) for k in range(len(SHAPES))]
    for _ in range(rounds):
        blobs = {p: A.encode_params(x, FP, "none") for p, x in zip(IDS, xs, strict=True)}
        blobs["p0"] = None
        new = list(xs)
        for p in live:
            res = A.gossip_step(p, blobs[p], blobs, IDS, bypass[p].adjacency(ring, IDS, p), SHAPES, FP, "none")
            bypass[p].observe(res.present, res.missing)
            new[IDS.index(p)] = res.params
        xs = new
    states = [xs[IDS.index(p)] for p in live]
    mean = [torch.stack([s[k] for s in states]).mean(0) for k in range(len(SHAPES))]
    err = float(np.sqrt(np.mean([A.params_sq_distance(s, mean) for s in states])))
    return err, A.params_sq_distance(mean, mean0) ** 0.5


def test_routing_around_a_silent_node_closes_the_ring() -> None:
    """A ring with a silent node is a path and mixes slowly; routed around, it is a 7-node ring again, and
    (both sides route around it) the rows stay doubly stochastic, so the live nodes' mean does not move."""
    path_err, path_drift = _consensus_beside_a_silent_node(after=0)
    ring_err, ring_drift = _consensus_beside_a_silent_node(after=3)
    assert ring_err < 0.1 * path_err, (ring_err, path_err)
    assert ring_drift < 1e-5 and path_drift < 1e-5, (ring_drift, path_drift)


def test_a_refused_neighbour_is_routed_around_too() -> None:
    """The robust rule refusing a neighbour every round counts as missing: its neighbours link past it."""
    g = torch.Generator().manual_seed(1)
    xs = [[torch.randn(s, generator=g) * 0.01 for s in SHAPES] for _ in IDS]
    ring, rob, b = T.ring(8), RobustAverager(), Bypass(3)
    rob.averaged(xs[1])
    routed = []
    for _ in range(6):
        xs = [[t + 0.01 * torch.randn(t.shape, generator=g) for t in x] for x in xs]
        blobs = {p: A.encode_params(x, FP, "none") for p, x in zip(IDS, xs, strict=True)}
        blobs["p0"] = A.encode_params([t * 1e3 for t in xs[0]], FP, "none")  # refused as norm_outlier
        adj = b.adjacency(ring, IDS, "p1")
        res = A.gossip_step("p1", blobs["p1"], blobs, IDS, adj, SHAPES, FP, "none", robust=rob)
        b.observe(res.present, res.missing)
        routed.append(sorted(res.present))
        xs[1] = res.params
    assert routed[:3] == [["p2"]] * 3 and routed[3:] == [["p2", "p7"]] * 3, routed


@pytest.fixture(scope="module")
def tok():
    from swarm_node.models.factory import build_tokenizer

    return build_tokenizer()


def _rounds_of_a_dpo_node(tok, tmp_path, peers: list[str], serve, rounds: int, *sets: str) -> list[dict]:
    """`rounds` rounds of a real DPONode (a tiny Llama, `sets` on top of the DPO defaults) among `peers`
    (FakeDPOSwarm; our id is "me"), whose payload fetches `serve(peer, round, our_payload)` answers."""
    from swarm_node.dpo.neighbours import Neighbourhood
    from swarm_node.dpo.round import DPONode
    from swarm_node.models.factory import Preset, build_model

    torch.set_num_threads(1)
    pre = Preset("llama", hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, lr_full=1e-3, lr_lora=1e-3)
    build_model(pre, len(tok), tok.pad_token_id, tok.eos_token_id, 0).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = load_config(None, ["mode=dpo", f"model.path={tmp_path / 'm'}", "dpo.pairs_per_user=16", "dpo.heldout_pairs=16",
                             *sets])
    node = DPONode(cfg, tmp_path / "state")
    try:
        payload = A.encode_params(A.get_params(node.model), node.arch_fp, cfg.dpo.compression)
        swarm = FakeDPOSwarm(node.arch_fp, peers, lambda peer, r: serve(peer, r, payload))
        node.neighbourhood = Neighbourhood(cfg.dpo, swarm, node.arch_fp)
        return [node.run_round(evaluate=lambda: False) for _ in range(rounds)]
    finally:
        node.metrics.close()


@pytest.mark.parametrize("after", [3, 0])
def test_the_dpo_node_routes_around_a_silent_neighbour(tok, tmp_path, after: int) -> None:
    assert DPOConfig().bypass_after == 3  # on by default
    # a 4-node ring a-b-c-me (sorted ids) whose node a never answers
    rows = _rounds_of_a_dpo_node(tok, tmp_path, ["a", "b", "c"], lambda peer, r, payload: None if peer == "a" else payload,
                                 5, f"dpo.bypass_after={after}")
    # the ring on sorted ids a-b-c-me: our neighbours are a (silent) and c; a's other neighbour is b
    assert all(r["missing_neighbours"] == ["a"] for r in rows)
    if after:
        assert [r["routed_around"] for r in rows] == [[], [], [], ["a"], ["a"]]
        assert [r["neighbours"] for r in rows] == [["c"]] * 3 + [["b", "c"]] * 2
    else:
        assert all(r["routed_around"] == [] and r["neighbours"] == ["c"] for r in rows)


@pytest.mark.parametrize("aggregation", ["clipped", "mean"])
def test_the_dpo_node_widens_its_ring_under_the_clipped_rule(tok, tmp_path, aggregation: str) -> None:
    """dpo.min_neighbours (3) through DPONode's own round: on an 8-node ring a robust node fetches from and
    averages with its second neighbours too; a plain one keeps the two of the ring."""
    fetched: set[str] = set()
    [row] = _rounds_of_a_dpo_node(tok, tmp_path, list("abcdefg"), lambda peer, r, payload: fetched.add(peer) or payload,
                                  1, f"dpo.aggregation={aggregation}")
    # the ring on sorted ids a-b-...-g-me: our ring neighbours are g and a, the second ones f and b
    want = ["a", "b", "f", "g"] if aggregation == "clipped" else ["a", "g"]
    assert sorted(fetched) == want and row["neighbours"] == want


def test_pull_ratio_is_one_for_pulls_that_agree_and_zero_for_pulls_that_cancel() -> None:
    own = [torch.zeros(3)]
    same = A.pull_ratio(own, [torch.tensor([0.5, 0.0, 0.0])], {"a": 0.25, "b": 0.25}, {"a": 1.0, "b": 1.0})
    cancel = A.pull_ratio(own, [torch.zeros(3)], {"a": 0.25, "b": 0.25}, {"a": 1.0, "b": 1.0})
    assert abs(same - 1.0) < 1e-9 and cancel == 0.0
    assert A.pull_ratio(own, own, {"a": 0.5}, {"a": 0.0}) is None  # nothing pulled us


def test_a_stalled_node_widens_to_its_neighbours_neighbours_for_a_while() -> None:
    ring = T.ring(8)
    b = Bypass(after=3, stall_ratio=0.2)
    for _ in range(2):
        assert not b.observe(["p0", "p2"], [], pull_ratio=0.01)
    b.observe(["p0", "p2"], [], pull_ratio=0.5)  # a round that moved us: the count starts again
    assert not any(b.observe(["p0", "p2"], [], pull_ratio=0.01) for _ in range(2))
    assert b.observe(["p0", "p2"], [], pull_ratio=0.01)  # the third stalled round in a row
    assert b.routed_around() == {"p0", "p2"}
    assert _links(b.adjacency(ring, IDS, "p1"), "p1") == {"p0", "p2", "p7", "p3"}
    for _ in range(bypass.STALL_HOLD - 1):
        b.observe(["p0", "p2", "p3", "p7"], [], pull_ratio=0.7)
    assert b.routed_around() == {"p0", "p2"}
    b.observe(["p0", "p2", "p3", "p7"], [], pull_ratio=0.7)
    assert not b.routed_around() and b.adjacency(ring, IDS, "p1") is ring  # the hold is over
    off = Bypass(after=3)  # stall_ratio 0 (plain averaging): never
    assert not any(off.observe(["p0", "p2"], [], pull_ratio=0.0) for _ in range(10))
    with pytest.raises(ValueError):
        Bypass(3, stall_ratio=1.0)


def test_stalls_are_watched_under_the_clipped_rule_only() -> None:
    """The pull ratio is measured on clipped distances: plain averaging routes around, never widens."""
    clipped = Bypass.from_config(DPOConfig(aggregation="clipped", bypass_after=2, stall_ratio=0.3))
    assert (clipped.after, clipped.stall_ratio) == (2, 0.3)
    assert not clipped.observe(["p0", "p2"], [], pull_ratio=0.1) and clipped.observe(["p0", "p2"], [], pull_ratio=0.1)
    plain = Bypass.from_config(DPOConfig(aggregation="mean", bypass_after=2, stall_ratio=0.3))
    assert (plain.after, plain.stall_ratio) == (2, 0.0)
    assert not any(plain.observe(["p0", "p2"], [], pull_ratio=0.0) for _ in range(5))


def _ring_beside_a_dissensus_node(stall_ratio: float, rounds: int = 80, mode: str = "dissensus",
                                  ratios: dict[str, list[float]] | None = None, min_neighbours: int = 0) -> float:
    """Robust gossip on an 8-node ring whose node 0 sends each neighbour the point that cancels its pull
    towards its honest neighbour (tooling/dpo_adversary.py, mode dissensus, computed on each neighbour's own
    graph as the benchmark does). Each node starts at the common initial point and takes a local step
    towards its own target every round (non-IID data in miniature), through the real codec, gossip_step,
    RobustAverager and Bypass. Returns the honest nodes' consensus error at the end; `ratios` collects
    every honest node's pull ratio per round (None where nothing moved it)."""
    g = torch.Generator().manual_seed(2)
    targets = [[torch.randn(s, generator=g) for s in SHAPES] for _ in IDS]
    xs = [[torch.zeros(s) for s in SHAPES] for _ in IDS]
    ring, honest = T.widen(T.ring(8), min_neighbours), IDS[1:]
    robust = {p: RobustAverager() for p in honest}
    bypasses = {p: Bypass(3, stall_ratio) for p in honest}
    for p in honest:
        robust[p].averaged(xs[IDS.index(p)])
    attacker = HostileNeighbour(mode)
    last: dict[str, float | None] = {}  # each honest node's pull ratio last round

    def error() -> float:
        states = [xs[IDS.index(p)] for p in honest]
        mean = [torch.stack([s[k] for s in states]).mean(0) for k in range(len(SHAPES))]
        return float(np.sqrt(np.mean([A.params_sq_distance(s, mean) for s in states])))

    for r in range(rounds):
        xs = [[t + 0.05 * (a - t) for t, a in zip(x, tg, strict=True)] for x, tg in zip(xs, targets, strict=True)]
        graphs = {p: bypasses[p].adjacency(ring, IDS, p) for p in honest}
        blobs = {p: A.encode_params(x, FP, "none") for p, x in zip(IDS, xs, strict=True)}
        recipients = {}
        for p in honest:
            i = IDS.index(p)
            if graphs[p][i, 0]:
                w = T.mixing_matrix_from_adjacency(graphs[p])
                recipients[p] = recipient(xs, w, i, set(range(1, len(IDS))), float(w[i, 0]), last.get(p))
        sent = attacker.send(View(r, xs[0], {}, xs[0], recipients), sorted(recipients))
        new = list(xs)
        for p in honest:
            received = {**blobs, "p0": A.encode_params(sent[p], FP, "none") if p in sent else None}
            res = A.gossip_step(p, blobs[p], received, IDS, graphs[p], SHAPES, FP, "none", robust=robust[p])
            bypasses[p].observe(res.present, res.missing, res.pull_ratio)
            last[p] = res.pull_ratio
            if ratios is not None:
                ratios.setdefault(p, []).append(res.pull_ratio)
            new[IDS.index(p)] = res.params
        xs = new
    return error()


def test_a_ring_node_held_still_by_a_dissensus_neighbour_widens_and_reaches_consensus() -> None:
    """Without the stall rule the attacker's two neighbours never move (their pulls cancel), so the
    honest ring stays spread between them; with it they link to two more honest nodes and it closes."""
    held = _ring_beside_a_dissensus_node(stall_ratio=0.0)
    widened = _ring_beside_a_dissensus_node(stall_ratio=0.2)
    assert widened < 0.5 * held, (held, widened)


def test_a_paced_dissensus_neighbour_splits_a_ring_unless_the_ring_is_widened() -> None:
    """An attacker that knows the stall rule (tooling/dpo_adversary.py, mode paced) steers each neighbour's
    pull ratio to just over dpo.stall_ratio: the neighbourhood never widens, the two nodes beside it drift
    from the rest on their own data until they are refused (and refuse), and the honest ring splits as if
    there were no stall rule. With dpo.min_neighbours 3 the ring has its second neighbours too, and two
    honest neighbours of each of the attacker's outvote it."""
    ratios: dict[str, list[float]] = {}
    split = _ring_beside_a_dissensus_node(stall_ratio=0.2, mode="paced", ratios=ratios)
    unwatched = _ring_beside_a_dissensus_node(stall_ratio=0.0, mode="paced")
    widened = _ring_beside_a_dissensus_node(stall_ratio=0.2, mode="paced", min_neighbours=3)
    assert min(r for r in ratios["p1"][:4] if r is not None) > 0.0  # steered, not held at 0 as by dissensus
    assert split > 0.9 * unwatched, (split, unwatched)  # the stall rule did not help
    assert widened < 0.5 * split, (split, widened)
