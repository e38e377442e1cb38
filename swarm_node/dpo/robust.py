"""Robust averaging of DPO parameters: refuse what no honest neighbour sends, clip what remains.

A hostile neighbour can send any finite parameters of our shapes: scaled, sign-flipped or noisy ones, old
ones, or a small shift in the same direction every round. Plain averaging moves us by its mixing weight
times whatever it sent. `RobustAverager` keeps one node's state between rounds and applies, in order:

1. **Replays.** A payload whose bytes equal one received (from anyone, our own included) in an earlier of
   the last REPLAY_ROUNDS rounds is refused (`replayed`): an honest node changes its parameters every round.
2. **Outliers.** A neighbour whose difference ||x_j - x_i|| is over `outlier_factor` times its
   reference is refused (`norm_outlier`). The reference is the typical difference, or, for a neighbour
   we have accepted in PEER_TRUST rounds, the larger of that and the median of its last PEER_HISTORY
   accepted differences: a neighbour with that record is refused for a jump, far outside its own
   history, not for staying where it has been. Typical: the median of our recent accepted (clipped) differences once
   WARMUP of them are known; in gossip never below sqrt(2) times the norm of our own last update (our
   local steps since our last average: two independent steps of that size from the same point end about
   sqrt(2) times as far apart), which no neighbour can forge. That anchor matters on low-degree graphs:
   a ring node has two neighbours, so an attacker that sends points close to ours makes half of the
   differences it sees, and would otherwise shrink "typical" until the honest neighbour looked like the
   outlier. Honest neighbours took a step of the same kind from near the same point, so their
   differences are not much smaller than our own step. Nor is it below the lower median of this round's
   differences (with two or more neighbours): a node far from all of its neighbours (one that joins late
   from the initial model, or restarts from an old checkpoint) is the outlier, not they, and refusing
   them all kept it where it was for good (tests/test_dpo_robust.py). While at most half of them are
   hostile, the lower median is never above every honest neighbour's distance.
   Why a neighbour's own history: the typical difference shrinks as a swarm converges, but an honest
   node whose data no one else holds stays about one of its own (large) steps away. Measured
   (benchmarks/dpo_byzantine.py, exponential graph, the attacker in the slot of the other holder of
   user 0): the last holder's distance grew from 1 to 15-23 typical differences over 200 rounds while
   staying at 0.26-0.3; once refused by every neighbour it was cut off for good, and the others lost its
   user (worst node -5.4 points). Its own history keeps it in, clipped like any other neighbour. Why
   only after PEER_TRUST rounds: a sign flip (x0 - (x - x0)) is next to us at first and moves away as
   the swarm learns; excused by its own history from its fourth acceptance it was never refused, and
   on the widened ring one seed ended a node 10 points down (round 200). It is refused by about round
   20, before it has the record; the honest straggler had been accepted for over 100 rounds.
3. **Clipping.** Gossip: ClippedGossip (He, Karimireddy & Jaggi, "Byzantine-robust decentralized
   learning via ClippedGossip", 2022): x_i <- x_i + sum_j W_ij clip(x_j - x_i, tau_i) with
   clip(v, tau) = v min(1, tau / ||v||). The radius is adaptive: the distance of the (f+1)-th farthest
   accepted neighbour (f = `clip_farthest`), so the f farthest are pulled in to it (the paper's released
   code takes f = 1, the second-largest distance). Once a typical difference is known the radius is
   never below it, so honest neighbours at a typical distance are not clipped, and an attacker that sends
   our own parameters back to us (distance 0) cannot shrink the radius to nothing and cut us off from our
   honest neighbours. (The paper's theoretical radius, tau_i^2 = (1/delta_i) sum_j W_ij ||x_j - x_i||^2,
   would be sqrt(k / f) times the typical difference for k equal-weight neighbours: on the 8-node
   exponential graph that let a sign-flipping neighbour through unclipped, benchmarks/dpo_byzantine.py.)
   With f or fewer accepted neighbours there is nothing to compare with and nothing is clipped (outliers
   are still refused): a node whose other neighbour was refused would otherwise clip its one honest
   neighbour to the typical difference every round, which that clipping keeps from growing, and drift
   away from it (measured: a 3-node path of honest nodes beside a refused attacker stopped learning).
   f = 0 clips nothing.
   Federated: centered clipping (Karimireddy, He & Jaggi, "Learning from history for Byzantine robust
   optimization", 2021), one iteration, around the coordinate-wise median of the participants:
   x <- c + mean_j clip(x_j - c, tau), tau by the same rule. Everything here is computed from what
   every node received (no own-update anchor), so nodes that received the same payloads (with the same
   history) end bit-identical.

What it bounds: a clipped neighbour moves us by at most W_ij tau_i per round, and while at most f of our
neighbours are hostile, tau_i is at most the larger of the farthest honest neighbour's distance and the
typical difference (at least one of the f+1 farthest is honest). What it does not: a hostile neighbour
that stays within the honest spread but pushes the same way every round, and one that was accepted and
moves away gradually (a sign flip that starts next to us): it is clipped every round, never refused
(docs/security.md).

Memory: the last average (one float32 copy of the trainable parameters, for the own-update anchor),
HISTORY floats, PEER_HISTORY floats per neighbour judged in the last PEER_HISTORY rounds, and the digests of REPLAY_ROUNDS rounds of payloads. None of it is checkpointed: a node
(fresh or restarted) anchors on its parameters before its first round's local steps, and builds the
history again.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from swarm_node.swarm.averaging.payload import PayloadError

if TYPE_CHECKING:
    from swarm_node.config import DPOConfig

HISTORY = 64  # accepted (clipped) differences kept for the outlier test and the radius floor
WARMUP = 4  # accepted differences needed before outliers are refused
REPLAY_ROUNDS = 64  # rounds whose payload digests are remembered
PEER_HISTORY = 16  # a neighbour's own accepted differences kept (and rounds it is remembered unjudged)
PEER_TRUST = 32  # rounds a neighbour must have been accepted in before its own history can excuse it
MEDIAN_CHUNK = 1 << 20  # coordinates per sort in the coordinate-wise median (bounds its memory)


class Drops(Protocol):
    def drop(self, peer: str, err: PayloadError) -> None: ...


@dataclass
class Clipped:
    """What enters the average: accepted neighbours' parameters, the clipped ones pulled in to the radius."""

    params: dict[str, list[torch.Tensor]]
    clipped: list[str] = field(default_factory=list)
    radius: float | None = None  # None: no finite radius this round (nothing was clipped)
    distances: dict[str, float] = field(default_factory=dict)  # ||what enters - centre|| per neighbour


def distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """||a - b|| in float64, so that huge finite float32 values neither overflow nor lose the comparison."""
    return math.sqrt(sum(float(((x.double() - y.double()) ** 2).sum()) for x, y in zip(a, b, strict=True)))


def clip_towards(center: Sequence[torch.Tensor], x: Sequence[torch.Tensor], scale: float) -> list[torch.Tensor]:
    """center + scale (x - center), in float64 (a float32 difference of two huge values could overflow)."""
    return [(c.double() + (t.double() - c.double()) * scale).to(torch.float32) for c, t in zip(center, x, strict=True)]


def coordinate_median(states: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    """Coordinate-wise median (mean of the two middle values for an even count), in chunks of coordinates."""
    m = len(states)
    out = []
    for k, ref in enumerate(states[0]):
        flat = [s[k].reshape(-1) for s in states]
        res = torch.empty_like(flat[0])
        for a in range(0, flat[0].numel(), MEDIAN_CHUNK):
            srt = torch.stack([f[a:a + MEDIAN_CHUNK] for f in flat]).sort(dim=0).values
            # halves first: the sum of two huge finite float32 values could overflow
            res[a:a + MEDIAN_CHUNK] = srt[m // 2] if m % 2 else srt[m // 2 - 1] / 2 + srt[m // 2] / 2
        out.append(res.reshape(ref.shape))
    return out


@dataclass
class PeerRecord:
    """What we remember of one neighbour: when we last judged it, in how many rounds we accepted it,
    and its last PEER_HISTORY accepted differences."""

    last_round: int
    accepted: int = 0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=PEER_HISTORY))

    def accept(self, d: float) -> None:
        self.accepted += 1
        self.recent.append(d)


class RobustAverager:
    """One node's robust-averaging state between rounds: recent accepted differences and payload digests."""

    def __init__(self, clip_farthest: int = 1, outlier_factor: float = 3.0) -> None:
        self.clip_farthest = clip_farthest
        self.outlier_factor = outlier_factor
        self.history: deque[float] = deque(maxlen=HISTORY)
        self._seen: dict[bytes, int] = {}  # sha256 of a payload -> the round (call number) it was first seen
        self._round = 0
        self._last: list[torch.Tensor] | None = None  # our parameters after the last average
        self._peer: dict[str, PeerRecord] = {}  # the neighbours judged in the last PEER_HISTORY rounds

    @classmethod
    def from_config(cls, d: DPOConfig) -> RobustAverager | None:
        """None for `dpo.aggregation: mean` (plain averaging, for trusted swarms)."""
        return cls(d.clip_farthest, d.outlier_factor) if d.aggregation == "clipped" else None

    # ---- 1. replays ---------------------------------------------------------------------------------

    def screen(self, own_payload: bytes, received: Mapping[str, object], rejects: Drops) -> dict[str, object]:
        """The received payloads minus replays of earlier rounds' bytes (refused, counted); one call per round."""
        self._round += 1
        now = self._round
        out: dict[str, object] = {}
        fresh: dict[bytes, int] = {}
        for peer in sorted(received):
            blob = received[peer]
            if not isinstance(blob, bytes | bytearray | memoryview):
                out[peer] = blob  # None (missing) or junk the decoder refuses with its own reason
                continue
            h = hashlib.sha256(blob).digest()
            first = self._seen.get(h)
            if first is not None and first < now:
                rejects.drop(peer, PayloadError("replayed", f"the bytes of a payload seen {now - first} round(s) ago"))
                out[peer] = None
                continue
            fresh.setdefault(h, now)
            out[peer] = blob
        fresh.setdefault(hashlib.sha256(own_payload).digest(), now)
        for h, r in fresh.items():
            self._seen.setdefault(h, r)
        for h in [h for h, r in self._seen.items() if r <= now - REPLAY_ROUNDS]:
            del self._seen[h]
        return out

    # ---- 2. outliers and 3. the radius --------------------------------------------------------------

    def _typical(self, own_step: float | None, dists: Sequence[float] = ()) -> float | None:
        known = [statistics.median(self.history)] if len(self.history) >= WARMUP else []
        if own_step is not None and own_step > 0:
            known.append(math.sqrt(2) * own_step)
        finite = sorted(d for d in dists if math.isfinite(d))
        if known and len(finite) >= 2:  # the lower median of this round's neighbours: with one of them
            known.append(finite[(len(finite) - 1) // 2])  # hostile, never above every honest one's distance
        return max(known, default=None)

    def averaged(self, params: Sequence[torch.Tensor]) -> None:
        """Remember our parameters after this round's average (or before our first round's local steps):
        next round, our own update is measured from them."""
        self._last = [t.detach().clone() for t in params]

    @property
    def anchored(self) -> bool:
        return self._last is not None

    def own_step(self, own: Sequence[torch.Tensor]) -> float | None:
        """||own - our last average||: our local steps since the last round (None on the first round)."""
        if self._last is None or [t.shape for t in self._last] != [t.shape for t in own]:
            return None
        return distance(own, self._last)

    def _reference(self, peer: str, typical: float | None) -> tuple[float | None, str]:
        """What a neighbour's difference is compared with (None: nothing yet), and its name for the log:
        the typical difference, or the median of the neighbour's own recent accepted differences when
        that is larger and it has been accepted in PEER_TRUST rounds."""
        rec = self._peer.setdefault(peer, PeerRecord(self._round))
        if typical is not None and rec.accepted >= PEER_TRUST and statistics.median(rec.recent) > typical:
            return statistics.median(rec.recent), f"its own recent median {statistics.median(rec.recent):.3g}"
        return typical, "nothing yet" if typical is None else f"the recent median {typical:.3g}"

    def _judge(self, dists: dict[str, float], rejects: Drops,
               own_step: float | None = None) -> tuple[dict[str, float], float]:
        """Refuse outliers; the accepted distances and the clipping radius (inf: clip nothing)."""
        typical = self._typical(own_step, list(dists.values()))
        accepted: dict[str, float] = {}
        for peer in sorted(dists):
            d, (ref, whose) = dists[peer], self._reference(peer, typical)
            if not math.isfinite(d) or (ref is not None and d > self.outlier_factor * ref):
                rejects.drop(peer, PayloadError("norm_outlier", f"difference {d:.3g} > {self.outlier_factor:g} x {whose}"))
            else:
                accepted[peer] = d
                self._peer[peer].accept(d)
            self._peer[peer].last_round = self._round
        for peer in [p for p, rec in self._peer.items() if rec.last_round <= self._round - PEER_HISTORY]:
            del self._peer[peer]  # gone (or no longer our neighbour): its history would only be stale
        ranked = sorted(accepted.values(), reverse=True)
        f = self.clip_farthest
        if f == 0:
            return accepted, math.inf
        if len(ranked) <= f:  # nothing to compare with: clipping the one neighbour we still accept (often
            return accepted, math.inf  # the honest one beside a refused attacker) would only stall consensus
        return accepted, ranked[f] if typical is None else max(ranked[f], typical)

    def _pull_in(self, center: Sequence[torch.Tensor], params: Mapping[str, list[torch.Tensor]],
                 accepted: dict[str, float], tau: float) -> Clipped:
        out = Clipped({}, [], tau if math.isfinite(tau) else None)
        for peer, d in accepted.items():
            if d > tau:
                out.params[peer] = clip_towards(center, params[peer], tau / d)
                out.clipped.append(peer)
            else:
                out.params[peer] = params[peer]
            out.distances[peer] = min(d, tau)
        self.history.extend(out.distances.values())
        return out

    def gossip(self, own: Sequence[torch.Tensor], neighbours: Mapping[str, list[torch.Tensor]],
               rejects: Drops) -> Clipped:
        """Self-centred clipping (ClippedGossip) of the decoded neighbours; refused ones are left out.
        The caller passes the resulting average to `averaged` (gossip_step does)."""
        dists = {p: distance(x, own) for p, x in neighbours.items()}
        accepted, tau = self._judge(dists, rejects, self.own_step(own))
        return self._pull_in(own, neighbours, accepted, tau)

    def federated(self, params: Mapping[str, list[torch.Tensor]], rejects: Drops) -> Clipped:
        """Centered clipping around the coordinate-wise median of the participants (self included if one)."""
        order = sorted(params)
        center = coordinate_median([params[p] for p in order])
        accepted, tau = self._judge({p: distance(params[p], center) for p in order}, rejects)
        return self._pull_in(center, params, accepted, tau)
