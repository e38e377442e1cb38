"""The defences a peer's batch passes after it is converted to training groups (docs/security.md).

Each class answers one threat from the table "What a peer can do, and what stops it":
`ReplayWindow` (replays of completions, under another identity or back to us), `LogprobAudit` (fabricated
behaviour log-probs that buy the F-TIS cap's full weight), `SkewAudit` (the same, only on the
completions our rewards favour), `cap_share` (one identity taking a large share of a round) and
`NewcomerGate` (Sybil identities filling the round's K slots). grpo/admission.py drives them in order;
each is usable alone (tests/test_hostile_rollouts.py, benchmarks/sybil_newcomers.py).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from swarm_node.training.groups import TrainGroup

# ---- replays: the same completions under several identities (or sent back to us) count once ----


def completion_key(prompt_ids: np.ndarray, token_ids: np.ndarray, logprobs: np.ndarray) -> bytes:
    """Content hash of one completion: prompt ids, completion ids and log-probs on the wire's 1/64 grid.

    A peer that re-encodes another's batch as its own (a replay, docs/security.md) sends the same ids and
    the same quantized log-probs, so the key matches whatever identity announces it.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(prompt_ids, dtype="<i8").tobytes())
    h.update(b"|")
    h.update(np.asarray(token_ids, dtype="<i8").tobytes())
    h.update(b"|")
    h.update(np.rint(-np.asarray(logprobs, dtype=np.float64) * 64.0).astype("<i4").tobytes())
    return h.digest()


class ReplayWindow:
    """Completions seen over the last `window` rounds, from any peer and from this node itself.

    A completion already seen (another peer's copy, a replay of an earlier round, or our own samples
    sent back to us) is dropped and counted (`duplicate_completion`); a group left with fewer than two
    completions is dropped (`replayed_group`). Repeats *within* one group are kept: a sampler that draws
    the same answer several times (common on short answers) reports how likely it is, and dropping the
    copies would bias the group's advantages. A round's keys are kept while it is within `window` rounds
    *or* `max_age_s` seconds: a replayer re-announces old completions with a fresh generation time, so a
    node with fast rounds must remember as long as the intake would accept a batch's age (120 s), not only
    a few rounds. Memory: at most `max_keys` 16-byte keys.
    """

    def __init__(self, window: int, max_keys: int = 1_000_000, max_age_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = max(1, int(window))
        self.max_keys = max_keys
        self.max_age_s = max_age_s
        self.clock = clock
        self._by_round: dict[int, set[bytes]] = {}
        self._born: dict[int, float] = {}

    def _prune(self, round_: int) -> None:
        now = self.clock()
        self._born.setdefault(round_, now)
        old = [r for r in self._by_round
               if r > round_ or r <= round_ - self.window
               and (self.max_age_s <= 0 or now - self._born.get(r, now) > self.max_age_s)]
        for r in old:
            del self._by_round[r]
            self._born.pop(r, None)
        for r in [r for r in self._born if r not in self._by_round and r != round_]:
            del self._born[r]
        while sum(len(s) for s in self._by_round.values()) > self.max_keys and len(self._by_round) > 1:
            oldest = min(self._by_round)
            del self._by_round[oldest]
            self._born.pop(oldest, None)

    def _seen(self, key: bytes) -> bool:
        return any(key in s for s in self._by_round.values())

    def remember(self, round_: int, groups: list[TrainGroup]) -> None:
        """Record our own groups of this round (duplicates among them are not filtered)."""
        self._prune(round_)
        keys = self._by_round.setdefault(round_, set())
        for g in groups:
            keys.update(completion_key(g.prompt_ids, c, b) for c, b in zip(g.completions, g.behaviour_logprobs, strict=True))

    def admit(self, round_: int, groups: list[TrainGroup]) -> tuple[list[TrainGroup], Counter]:
        """Groups of one peer's batch with already-seen completions removed; remembers what it keeps."""
        self._prune(round_)
        keys = self._by_round.setdefault(round_, set())
        out, rejected = [], Counter()
        for g in groups:
            keep, fresh = [], []
            for i, (c, b) in enumerate(zip(g.completions, g.behaviour_logprobs, strict=True)):
                k = completion_key(g.prompt_ids, c, b)
                if self._seen(k):
                    rejected["duplicate_completion"] += 1
                    continue
                keep.append(i)
                fresh.append(k)
            if len(keep) < 2:
                rejected["replayed_group"] += 1
                continue
            keys.update(fresh)
            if len(keep) == len(g.completions):
                out.append(g)
            else:
                out.append(TrainGroup(prompt_ids=g.prompt_ids, completions=[g.completions[i] for i in keep],
                                      behaviour_logprobs=[g.behaviour_logprobs[i] for i in keep],
                                      rewards=np.asarray(g.rewards)[keep], source=g.source))
        return out, rejected


# ---- fabricated behaviour log-probs: the claims against our own recompute; a per-identity share cap ----


@dataclass(frozen=True)
class LogprobAudit:
    """Refuses a peer's batch whose claimed log-probs make our importance weights too large on average.

    For tokens really sampled from the peer's distribution q, E_q[p/q] = sum over the support of p <= 1,
    whatever our model p is, so the mean of the capped weight min(p/q, cap) over a batch stays below 1
    up to noise. Fabricated low log-probs (they buy the cap's full 2x on positive-advantage completions;
    docs/security.md, "The log-prob audit") push it toward the cap. The per-token weights lie in [0, cap] and, given their prefixes,
    each has mean <= 1, so by Azuma-Hoeffding an honest batch of n tokens exceeds
    1 + margin + cap * sqrt(ln(1/delta) / (2 n)) with probability at most delta, for any honest model
    (`margin` covers the wire's 1/128 log-prob rounding). Only batches whose log-probs are not their
    sampling distribution (top-k/top-p truncation, another temperature) are at risk of a false positive.
    """

    cap: float = 2.0
    delta: float = 1e-4
    margin: float = 0.02
    min_tokens: int = 32

    def threshold(self, n_tokens: int) -> float:
        return 1.0 + self.margin + self.cap * math.sqrt(math.log(1.0 / self.delta) / (2.0 * max(n_tokens, 1)))

    def statistic(self, groups: list[TrainGroup], recomputed: list[list[np.ndarray]]) -> tuple[float, int]:
        """(mean capped weight min(exp(logp - logq), cap) over all completion tokens, token count)."""
        ratios = [np.exp(np.minimum(np.asarray(lp, np.float64) - np.asarray(b, np.float64), math.log(self.cap)))
                  for g, lps in zip(groups, recomputed, strict=True)
                  for lp, b in zip(lps, g.behaviour_logprobs, strict=True) if len(lp)]
        if not ratios:
            return 0.0, 0
        flat = np.concatenate(ratios)
        return float(flat.mean()), int(flat.size)

    def judge(self, groups: list[TrainGroup], recomputed: list[list[np.ndarray]]) -> tuple[bool, float, float]:
        """(accept, statistic, threshold); batches under `min_tokens` tokens are accepted unjudged."""
        stat, n = self.statistic(groups, recomputed)
        limit = self.threshold(n)
        return n < self.min_tokens or stat <= limit, stat, limit


def cap_share(groups: list[TrainGroup], max_groups: int) -> tuple[list[TrainGroup], int]:
    """At most `max_groups` of one identity's groups in a round (the rest counted `share_capped`).

    With the cap at this node's own prompts per round, no single identity outweighs our own samples;
    a Sybil needs as many identities as it wants shares, each of which still costs it a slot of K.
    """
    if max_groups < 0 or len(groups) <= max_groups:
        return groups, 0
    return groups[:max_groups], len(groups) - max_groups


def cap_tokens(groups: list[TrainGroup], max_tokens: int) -> tuple[list[TrainGroup], int]:
    """The identity's groups, in order, while their completion tokens add up to at most `max_tokens` (the
    rest counted `token_capped`; max_tokens <= 0: no cap).

    Compute, not bytes: maximal-length but correct completions pass every check, and each costs our
    audits' forward pass and the training step in proportion to its tokens. With the budget at our own
    round's completion tokens, one identity costs at most what our own samples do.
    """
    if max_tokens <= 0:
        return groups, 0
    kept, used = [], 0
    for g in groups:
        n = sum(len(c) for c in g.completions)
        if used + n > max_tokens:
            break
        kept.append(g)
        used += n
    return kept, len(groups) - len(kept)


# ---- fabrication targeted at positive-advantage completions only (docs/security.md, "The skew audit") ----


@dataclass
class SkewAudit:
    """Per-peer running test of claimed log-probs lowered only where they pay (positive advantage).

    The mean-weight audit above cannot see an attacker that lowers its claimed log-probs only on the
    completions our recomputed rewards favour: those are a small share of a batch's tokens, and an honest
    but different model leaves headroom under 1. Such an attacker shifts the log-ratio
    log p (ours, recomputed) - log q (claimed) by its delta on exactly those completions. So, per group
    with mixed rewards, we take the gap between the mean clipped log-ratio of its positive-advantage
    completions and of the others (within a group, so prompt difficulty and model differences common to
    the group cancel), and keep each peer's gaps over its last `window` batches. A batch is refused
    (`logprob_skew`) when that running mean gap is above `tolerance` with z-score `z` (mean - z*SE).

    What it costs and what it leaves: an honest but different model has a gap of its own (a judge that is
    better at the task gives right answers higher p); `tolerance` is sized from measuring tiny-m judged by
    tiny-s (benchmarks/logprob_audit.py, docs/security.md). An attacker that keeps its delta under the
    tolerance passes, but then gains at most exp(tolerance) (1.42x at 0.35 nats) on those tokens, instead of
    the F-TIS cap's 2x. Memory: `window` floats per group for at most `max_peers` peers.
    """

    tolerance: float = 0.35
    z: float = 3.0
    window: int = 16
    min_groups: int = 8
    clip: float = 4.0
    max_peers: int = 4096
    _history: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def gaps(self, groups: list[TrainGroup], recomputed: list[list[np.ndarray]]) -> list[float]:
        """Per group with mixed rewards: mean log-ratio of positive-advantage completions minus the rest's."""
        out = []
        for g, lps in zip(groups, recomputed, strict=True):
            r = np.asarray(g.rewards, np.float64)
            pos = r > r.mean() + 1e-9
            if not pos.any() or pos.all():
                continue
            means = np.array([
                float(np.clip(np.asarray(lp, np.float64) - np.asarray(b, np.float64), -self.clip, self.clip).mean())
                if len(lp) else 0.0
                for lp, b in zip(lps, g.behaviour_logprobs, strict=True)])
            out.append(float(means[pos].mean() - means[~pos].mean()))
        return out

    def judge(self, peer_id: str, groups: list[TrainGroup],
              recomputed: list[list[np.ndarray]]) -> tuple[bool, float, float]:
        """(accept, running mean gap, its lower confidence bound); remembers this batch's gaps either way."""
        hist = self._history.pop(peer_id, None)
        if hist is None:
            hist = deque(maxlen=self.window)
        self._history[peer_id] = hist
        while len(self._history) > self.max_peers:
            self._history.popitem(last=False)
        hist.append(self.gaps(groups, recomputed))
        flat = np.array([x for b in hist for x in b], dtype=np.float64)
        if flat.size < self.min_groups:
            return True, float(flat.mean()) if flat.size else 0.0, float("-inf")
        mean = float(flat.mean())
        lower = mean - self.z * float(flat.std(ddof=1)) / math.sqrt(flat.size)
        return lower <= self.tolerance, mean, lower

    def forget(self, peer_id: str) -> None:
        self._history.pop(peer_id, None)


# ---- Sybils filling K: what identities not yet established may take of a round ----


class NewcomerGate:
    """Bounds the share of a round's K peer slots that identities not yet established can take.

    Identities cost nothing, so the per-identity share cap alone lets a Sybil fill all K slots with many
    identities. Here an identity is *established* once its batches passed every check (decode, admission,
    both log-prob audits) in `established_after` distinct rounds. Of the K batches a round takes
    (`choose`), at most `max_new` come from newcomers, in the order first heard, and the rest from
    established peers at random; newcomers passed over stay buffered and are counted `newcomer_capped`.
    So a flood of fresh identities takes at most max_new / K of a round, never displaces peers that have
    shown good behaviour, and an honest newcomer waits only behind the newcomers heard before it. The
    cost: a newcomer takes `established_after` rounds before it competes for every slot, one heard behind
    N queued newcomers waits about N * established_after / max_new rounds, and a swarm where everyone is
    new fills at most `max_new` slots a round until peers establish (benchmarks/sybil_newcomers.py).

    Patient Sybils establish too, one every `established_after` rounds. So the established slots are not
    drawn uniformly but in proportion to `volume ** volume_power`, an identity's *verified volume*: the
    completions its batches carried through every check (a running mean, at most the share cap's groups
    x G). Completions, not tokens, so that long answers buy nothing (the token budget bounds those), and
    each costs the sender a prompt's prefill and its sampling. With power 2, an attacker who splits a fixed compute over n identities divides its total
    weight by n, so splitting stops paying (the superlinear reward of grail-v0); one with as much compute
    as n honest peers still weighs as n honest peers, which no identity rule can tell apart. Power 0 is
    the uniform draw. The cost: an honest peer that sends half the completions a batch weighs a quarter.
    Memory: two integers and a float per identity for at most `max_peers` identities.
    """

    VOLUME_EMA = 0.25  # weight of a batch's completions in its sender's running volume

    def __init__(self, max_new: int, established_after: int = 2, max_peers: int = 4096,
                 rng: random.Random | None = None, volume_power: float = 2.0) -> None:
        self.max_new = max(0, int(max_new))
        self.established_after = max(0, int(established_after))
        self.max_peers = max_peers
        self.volume_power = max(0.0, float(volume_power))
        self._passed: OrderedDict[str, set[int]] = OrderedDict()  # identity -> rounds it passed (bounded)
        self._volume: dict[str, float] = {}  # identity -> running mean of its passed batches' completions
        self._first_heard: OrderedDict[str, int] = OrderedDict()  # identity -> order first heard
        self._heard = 0
        self._round = None
        self._new_used = 0
        self._pending: set[str] = set()  # newcomers given a slot this round that have not passed yet
        self.rng = rng or random.Random()
        self.passed_over = 0  # newcomers' batches left in the buffer by the last choose()

    def established(self, peer_id: str) -> bool:
        return len(self._passed.get(peer_id, ())) >= self.established_after

    def rounds_passed(self, peer_id: str) -> frozenset[int]:
        """The rounds in which this identity's batch passed every check (what makes it established)."""
        return frozenset(self._passed.get(peer_id, ()))

    def rank(self, peer_id: str) -> tuple[int, int]:
        """Sort key for the intake: established first, then newcomers in the order first heard."""
        if self.established(peer_id):
            return (0, 0)
        order = self._first_heard.get(peer_id)
        if order is None:
            order = self._heard
            self._heard += 1
            self._first_heard[peer_id] = order
            while len(self._first_heard) > self.max_peers:
                self._first_heard.popitem(last=False)
        return (1, order)

    def choose(self, offers: list, k: int) -> list[int]:
        """Indices of the offers to take: up to `max_new` newcomers (first heard first), the rest established
        peers at random. `offers` need a `peer_id` (swarm.intake.Offer)."""
        est = [i for i, o in enumerate(offers) if self.established(o.peer_id)]
        new = sorted((i for i, o in enumerate(offers) if not self.established(o.peer_id)),
                     key=lambda i: self.rank(offers[i].peer_id))
        n_new = min(self.max_new, len(new), k)
        picked = new[:n_new] + self._draw(est, [offers[i].peer_id for i in est], min(k - n_new, len(est)))
        self.passed_over = len(new) - n_new
        return picked

    def volume(self, peer_id: str) -> float:
        return self._volume.get(peer_id, 0.0)

    def _draw(self, items: list[int], peers: list[str], n: int) -> list[int]:
        """n of `items` without replacement, each in proportion to its peer's volume ** power
        (Efraimidis & Spirakis: the n largest u ** (1 / w))."""
        if self.volume_power == 0.0 or n >= len(items):
            return self.rng.sample(items, n)
        top = max((self.volume(p) for p in peers), default=0.0) or 1.0
        weights = [max(self.volume(p) / top, 1e-6) ** self.volume_power for p in peers]
        keys = [self.rng.random() ** (1.0 / max(w, 1e-300)) for w in weights]
        order = sorted(range(len(items)), key=lambda j: keys[j], reverse=True)
        return [items[j] for j in order[:n]]

    def start_round(self, round_: int) -> None:
        """A newcomer that took a slot last round and did not pass goes to the back of the queue, so
        identities sending junk cannot hold the newcomer slots."""
        for pid in self._pending:
            if pid in self._first_heard:
                del self._first_heard[pid]
            self.rank(pid)
        self._pending.clear()
        self._round, self._new_used = round_, 0

    def admit(self, peer_id: str) -> bool:
        """May this round use a batch of `peer_id`? Takes one of the round's newcomer slots if it is new."""
        if self.established(peer_id):
            return True
        if self._new_used >= self.max_new:
            return False
        self._new_used += 1
        self._pending.add(peer_id)
        return True

    def passed(self, peer_id: str, round_: int, completions: int = 1) -> None:
        """A batch of `peer_id` passed every check in round `round_`, carrying `completions` completions."""
        self._pending.discard(peer_id)
        rounds = self._passed.pop(peer_id, set())
        if len(rounds) < self.established_after:
            rounds.add(int(round_))
        self._passed[peer_id] = rounds
        old = self._volume.get(peer_id)
        self._volume[peer_id] = float(completions) if old is None else old + self.VOLUME_EMA * (completions - old)
        while len(self._passed) > self.max_peers:
            gone, _ = self._passed.popitem(last=False)
            self._volume.pop(gone, None)
