"""One receiving node's round choice, simulated: which peers' batches it uses, round by round.

The real Intake (swarm/intake.py) and the real newcomer gate (node.defences.NewcomerGate), driven with the
node's own order (take K ranked offers; admit; every batch here passes its checks, so the only thing an
attacker spends is identities). Shared by benchmarks/sybil_newcomers.py (what the gate buys against
Sybils) and tests/test_hostile_rollouts.py (patient Sybils lose their slots).
"""

from __future__ import annotations

import random

from swarm_node.grpo.defences import NewcomerGate
from swarm_node.swarm.intake import Freshness, Intake, Offer


def simulate(rounds: int, peers_at, k: int, gate: NewcomerGate | None, seed: int,
             completions_of=lambda pid: 32) -> list[list[str]]:
    """Per round, the peers whose batches were used. `peers_at(r)` lists the peers offering in round r;
    `completions_of(pid)`: the completions each of its batches carries through the checks."""
    clock = [1_000_000.0]
    intake = Intake(Freshness(), max_batches=100_000, max_bytes=10**12, clock=lambda: clock[0],
                    rng=random.Random(seed))
    used_by_round = []
    for r in range(1, rounds + 1):
        clock[0] += 1.0
        for pid in peers_at(r):
            _v, fetch = intake.offer(Offer(pid, r, r - 1, clock[0], 10, "0" * 64, {}))
            if fetch is not None:
                intake.fetched(fetch, b"x" * 10)
        taken, refetch = intake.take(k, choose=None if gate is None else gate.choose)
        for o in refetch:  # the peers' newer offers, downloaded at once
            intake.fetched(o, b"x" * 10)
        used = []
        if gate is not None:
            gate.start_round(r)
            taken = sorted(taken, key=lambda b: gate.rank(b.offer.peer_id))
        for b in taken:
            pid = b.offer.peer_id
            if gate is not None and not gate.admit(pid):
                continue
            used.append(pid)
            if gate is not None:
                gate.passed(pid, r, completions=completions_of(pid))
        used_by_round.append(used)
    return used_by_round
