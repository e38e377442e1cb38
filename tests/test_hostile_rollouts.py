"""Replays under new identities, fabricated behaviour log-probs and Sybil shares (docs/security.md, grpo/defences.py)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np

from swarm_node.grpo.defences import LogprobAudit, NewcomerGate, ReplayWindow, SkewAudit, cap_share
from swarm_node.protocol import Completion, Group, RolloutBatch, decode_batch, encode_batch
from swarm_node.swarm.intake import Freshness, Intake, Offer
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


def test_a_replay_many_fast_rounds_later_is_still_caught_within_the_age_limit() -> None:
    """Rounds of half a second: a batch re-announced 20 rounds (10 s) later, with a fresh generation time,
    passes the intake's age check; the window must remember it as long (by time, not only by rounds)."""
    now = [0.0]
    w = ReplayWindow(window=4, max_age_s=130.0, clock=lambda: now[0])
    original = reencoded(groups(5), "peer-a")
    assert len(w.admit(1, original)[0]) == 3
    for r in range(2, 22):
        now[0] += 0.5
        w.admit(r, [])
    kept, rej = w.admit(22, reencoded(groups(5), "replayer"))
    assert kept == [] and rej["replayed_group"] == 3
    now[0] += 200.0  # past the age limit: the intake would refuse such a batch anyway, and memory is freed
    w.admit(23, [])
    assert all(r >= 23 - 4 for r in w._by_round)


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


# ---- targeted fabrication (positive-advantage completions only) and Sybils filling K ----


def _mixed_batch(rng, p_logits, q_logits, *, n_groups=8, g=8, length=6, delta=0.0):
    """Groups of completions sampled from q with random 0/1 rewards; the claimed log-probs are lowered by
    `delta` only on completions whose reward is above their group's mean (what buys F-TIS weight)."""
    logq = q_logits - np.log(np.exp(q_logits).sum(-1, keepdims=True))
    logp = p_logits - np.log(np.exp(p_logits).sum(-1, keepdims=True))
    gs, recomputed = [], []
    for _ in range(n_groups):
        rewards = (rng.random(g) < 0.3).astype(np.float32)
        claimed, ours = [], []
        for r in rewards:
            pos = rng.integers(0, len(q_logits), length)
            tok = np.argmax(logq[pos] + rng.gumbel(size=(length, q_logits.shape[1])), axis=1)
            d = delta if r > rewards.mean() else 0.0
            claimed.append((np.rint((logq[pos, tok] - d) * 64) / 64).astype(np.float32))
            ours.append(logp[pos, tok])
        gs.append(TrainGroup(prompt_ids=np.zeros(1, np.int64), completions=[np.zeros(length, np.int64)] * g,
                             behaviour_logprobs=claimed, rewards=rewards, source="peer"))
        recomputed.append(ours)
    return gs, recomputed


def test_skew_audit_catches_positive_advantage_fabrication_the_mean_audit_misses() -> None:
    rng = np.random.default_rng(1)
    q_logits = rng.normal(0, 2.0, (16, 50))
    p_logits = q_logits + rng.normal(0, 1.0, (16, 50))  # an honest but different model
    mean_audit, skew = LogprobAudit(), SkewAudit()
    honest = [_mixed_batch(rng, p_logits, q_logits) for _ in range(40)]
    attack = [_mixed_batch(rng, p_logits, q_logits, delta=0.7) for _ in range(20)]
    # targeted log-prob fabrication (docs/security.md): the batch-mean audit passes every targeted batch
    assert all(mean_audit.judge(gs, lp)[0] for gs, lp in attack)
    honest_verdicts = [skew.judge("honest", gs, lp)[0] for gs, lp in honest]
    attack_verdicts = [skew.judge("attacker", gs, lp)[0] for gs, lp in attack]
    assert all(honest_verdicts)  # no false positive over 40 batches of a different model
    assert sum(not ok for ok in attack_verdicts) >= 18  # caught from the second batch on
    same = SkewAudit()
    assert all(same.judge("same", *_mixed_batch(rng, q_logits, q_logits))[0] for _ in range(20))


def test_skew_audit_state_is_per_peer_and_bounded() -> None:
    rng = np.random.default_rng(2)
    q_logits = rng.normal(0, 2.0, (16, 50))
    skew = SkewAudit(max_peers=3)
    for i in range(10):
        skew.judge(f"p{i}", *_mixed_batch(rng, q_logits, q_logits, n_groups=2))
    assert len(skew._history) == 3
    bad = _mixed_batch(rng, q_logits, q_logits, delta=3.0)
    assert not skew.judge("bad", *bad)[0]
    assert skew.judge("good", *_mixed_batch(rng, q_logits, q_logits))[0]  # another peer's evidence is its own


def _buffered(intake: Intake, clock: list[float], peer: str, round_: int) -> None:
    _verdict, fetch = intake.offer(Offer(peer, round_, round_ - 1, clock[0], 10, "0" * 64, {}))
    if fetch is not None:
        intake.fetched(fetch, b"x" * 10)


def _sybil_rounds(gate: NewcomerGate | None, rounds: int = 12, sybils: int = 40, k: int = 4):
    """Three honest peers in a swarm from round 1, `sybils` fresh identities flooding from round 4 on;
    returns the honest peers' share of the slots used in rounds 6.. and the rounds in which a late honest
    newcomer (heard in round 4, just before the flood) was used."""
    clock = [1_000_000.0]
    intake = Intake(Freshness(), max_batches=1000, max_bytes=10**9, clock=lambda: clock[0], rng=random.Random(0))
    honest = ["h1", "h2", "h3"]
    used_honest = used_all = 0
    late_used = []
    for r in range(1, rounds + 1):
        clock[0] += 1.0
        peers = list(honest)
        if r >= 4:  # an honest newcomer, heard just before the flood begins
            peers.append("late")
        if r >= 4:
            peers += [f"sybil{r}-{i}" for i in range(sybils)]  # new identities every round
        for pid in peers:
            _buffered(intake, clock, pid, r)
        taken, refetch = intake.take(k, choose=None if gate is None else gate.choose)
        for o in refetch:  # the peers' newer offers, downloaded at once
            intake.fetched(o, b"x" * 10)
        if gate is not None:
            gate.start_round(r)
        used = []
        for b in sorted(taken, key=lambda b: gate.rank(b.offer.peer_id)) if gate else taken:
            pid = b.offer.peer_id
            if gate is not None and not gate.admit(pid):
                continue
            used.append(pid)
            if gate is not None:
                gate.passed(pid, r)  # every batch here is well-behaved: the flood costs only identities
        if r >= 6:
            used_all += len(used)
            used_honest += sum(p in honest or p == "late" for p in used)
        if "late" in used:
            late_used.append(r)
    return used_honest / max(1, used_all), late_used


def test_newcomer_gate_keeps_a_sybil_flood_from_filling_k() -> None:
    share_without, _ = _sybil_rounds(None)
    gate = NewcomerGate(max_new=1, established_after=2, rng=random.Random(0))
    share_with, late = _sybil_rounds(gate)
    # Sybils (docs/security.md): without the gate, 40 fresh identities a round take nearly every slot
    assert share_without < 0.25
    assert share_with >= 0.75  # established peers keep their slots; Sybils get at most the newcomer share
    # one newcomer slot a round, two rounds to establish: h1..h3 (new at round 1) take rounds 1-6, then the
    # late newcomer, heard before the Sybils, is next whatever the flood (and then draws among the established)
    assert late[:2] == [7, 8] and gate.established("late")
    _, late_without = _sybil_rounds(None)
    assert len(late_without) <= 3  # without the gate it wins a slot only by chance


def test_patient_sybils_that_split_a_compute_budget_over_many_identities_lose_their_slots() -> None:
    """The same 40 well-behaved identities for 200 rounds, with as much compute as the 3 honest peers
    together (2 completions a batch each, against 32): drawn uniformly they establish and take nearly
    every slot; drawn by verified volume (the default) the honest peers keep theirs."""
    from tooling.newcomer_rounds import simulate

    honest = ["h0", "h1", "h2"]

    def peers(r):
        return honest + ([f"p{i}" for i in range(40)] if r >= 8 else [])

    def completions_of(pid):
        return 32 if pid in honest else 2

    def honest_per_round(gate):
        used = simulate(200, peers, 4, gate, 0, completions_of)[100:]
        return sum(p in honest for u in used for p in u) / len(used)

    uniform = honest_per_round(NewcomerGate(max_new=1, rng=random.Random(0), volume_power=0.0))
    weighted = honest_per_round(NewcomerGate(max_new=1, rng=random.Random(0)))
    assert uniform < 1.0 and weighted >= 2.5, (uniform, weighted)
    # with as much compute as 40 honest peers (32 each), they weigh as 40 honest peers: no identity rule helps
    full = sum(p in honest for u in simulate(200, peers, 4, NewcomerGate(max_new=1, rng=random.Random(0)), 0)[100:]
               for p in u) / 100
    assert full < 1.0


def test_the_volume_draw_is_in_proportion_to_volume_squared() -> None:
    gate = NewcomerGate(max_new=1, established_after=1, rng=random.Random(3))
    for pid, n in (("big", 32), ("half", 16)):
        gate.passed(pid, 1, completions=n)
    offers = [Offer(p, 2, 1, 0.0, 10, "0" * 64, {}) for p in ("big", "half")]
    firsts = Counter(offers[gate.choose(offers, 1)[0]].peer_id for _ in range(4000))
    assert abs(firsts["half"] / 4000 - 0.2) < 0.03, firsts  # 16^2 / (16^2 + 32^2)
    gate.passed("half", 2, completions=32)  # a running mean: one batch moves it a quarter of the way
    assert gate.volume("half") == 20.0


def test_a_newcomer_that_fails_its_checks_goes_to_the_back() -> None:
    gate = NewcomerGate(max_new=1, established_after=2)
    assert gate.rank("junk") < gate.rank("honest")
    gate.start_round(1)
    assert gate.admit("junk") and not gate.admit("honest")  # one newcomer slot: the first heard takes it
    gate.start_round(2)  # junk did not pass: demoted behind the honest newcomer
    assert gate.rank("honest") < gate.rank("junk")
    assert gate.admit("honest")
    gate.passed("honest", 2)
    gate.start_round(3)
    assert gate.admit("honest") and not gate.established("honest")
    gate.passed("honest", 3)
    assert gate.established("honest") and gate.rank("honest") == (0, 0)
    gate.start_round(4)
    assert gate.admit("honest") and gate.admit("junk")  # established peers do not use the newcomer slot
