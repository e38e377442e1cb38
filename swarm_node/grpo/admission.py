"""Admission: everything between a peer's downloaded batch and the GRPO trainer, in one place.

Two stages (docs/architecture.md, "Processes and threads"; the threats each check answers are in
docs/security.md):

1. **On the swarm's decode thread**, as each download completes: `check_payload` decodes the bytes under
   the receive limits and checks the round against its announcement. A plain function of the bytes and
   the limits (no model, no tokenizer), so it is safe off the round loop; `payload_check(limits)` binds
   the limits and is the validator a GRPO node builds its `SwarmPeer` with (swarm/receiver.py
   `Validator`: it refuses by raising `PayloadRefused`). Refusals: `protocol:*`, `round_mismatch`.
2. **On the round loop**, `Admission.admit(batches, round_)`, for the batches this round took. Per batch, in
   this order: the newcomer gate (Sybils), conversion to training groups (grpo/rollouts.py
   `peer_groups`: swarm, task, tokenizer and vocab match, prompts rebuilt, rewards recomputed), the
   replay window, the per-identity share cap, the log-prob audit and the skew audit (grpo/defences.py). A
   batch that passed all of them counts towards its sender becoming established.

Every rejection is counted by a reason of node/reasons.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarm_node.config import NodeConfig
from swarm_node.grpo.defences import (
    LogprobAudit,
    NewcomerGate,
    ReplayWindow,
    SkewAudit,
    cap_share,
    cap_tokens,
)
from swarm_node.grpo.rollouts import Expectations, peer_groups
from swarm_node.node.reasons import Rejections
from swarm_node.protocol import DecodeLimits, ProtocolError, RolloutBatch, decode_batch
from swarm_node.swarm import Offer, PayloadRefused, Validator
from swarm_node.swarm.ratelimit import RateLimitedLog
from swarm_node.tasks.base import Task
from swarm_node.training.groups import TrainGroup


def check_payload(payload: bytes, announced_round: int, limits: DecodeLimits) -> tuple[RolloutBatch | None, str | None, str]:
    """Decode a peer's batch and check it is the announced round -> (batch, None, "") or (None, reason, detail)."""
    try:
        decoded = decode_batch(payload, limits)
    except ProtocolError as exc:
        return None, f"protocol:{exc.reason}", str(exc)
    if decoded.round != announced_round:  # the payload must be what the announcement said
        return None, "round_mismatch", f"payload says round {decoded.round}, announced {announced_round}"
    return decoded, None, ""


def payload_check(limits: DecodeLimits) -> Validator:
    """`check_payload` under fixed receive limits, as the swarm's validator: (payload, offer) -> the batch,
    or `PayloadRefused(reason, detail)` (counted by the swarm under that reason, logged rate-limited)."""

    def check(payload: bytes, offer: Offer) -> RolloutBatch:
        decoded, reason, detail = check_payload(payload, offer.round, limits)
        if reason is not None:
            raise PayloadRefused(reason, detail)
        return decoded

    return check


@dataclass
class AdmittedRound:
    """What one round admitted from its peers' batches."""

    groups: list[TrainGroup] = field(default_factory=list)
    rejected: Rejections = field(default_factory=Rejections)
    rewards_overridden: int = 0  # completions whose claimed reward our recompute changed
    groups_by_peer: dict[str, int] = field(default_factory=dict)  # "<peer id tail>:<model>" -> groups trained on
    batch_ages_s: list[float] = field(default_factory=list)  # of the batches that gave groups
    version_lags: list[int] = field(default_factory=list)


class Admission:
    """The admission policy of a GRPO node: which peers' batches it takes, and what of them it trains on.

    Owns the defences' state (replay window, the two log-prob audits, the newcomer gate) and the share
    cap. `recompute(groups)` is the trainer's log-probs of the groups' completion tokens under the
    current model (`FTISTrainer.completion_logprobs`), which both audits judge the claimed ones against.
    """

    def __init__(self, cfg: NodeConfig, task: Task, tokenizer: Any, expect: Expectations,
                 recompute: Callable[[list[TrainGroup]], list[list[np.ndarray]]],
                 encode: Callable[[str], list[int]] | None = None, log: logging.Logger | None = None) -> None:
        sw = cfg.swarm
        self.task, self.tokenizer, self.expect, self.recompute, self.encode = task, tokenizer, expect, recompute, encode
        # replays: a completion counts once, over as many rounds as the intake would accept a batch's age
        self.replay = ReplayWindow(window=sw.staleness_rounds + 2, max_age_s=sw.max_batch_age_s + 10)
        a = cfg.admission
        # fabricated log-probs: the claims against our recompute
        self.audit = LogprobAudit(cap=cfg.training.cap, delta=a.audit_delta, margin=a.audit_margin,
                                  min_tokens=a.audit_min_tokens)
        # the same, targeted: lowered only on positive-advantage completions, per peer
        self.skew = SkewAudit(tolerance=a.skew_tolerance, z=a.skew_z, window=a.skew_window,
                              min_groups=a.skew_min_groups)
        # Sybils: identities not yet established take at most a quarter of the K slots a round (at least 1)
        slots = max(1, sw.max_peers_per_round // 4) if a.newcomer_slots is None else a.newcomer_slots
        self.newcomers = NewcomerGate(max_new=slots, established_after=a.established_after,
                                      volume_power=a.volume_power)
        # no identity outweighs our own samples
        self.max_groups_per_peer = cfg.task.prompts_per_round if a.max_groups_per_peer is None else a.max_groups_per_peer
        # nor costs more compute than they do: completion tokens of one identity a round
        own_tokens = cfg.task.prompts_per_round * cfg.generation.num_generations * cfg.generation.max_new_tokens
        self.max_tokens_per_peer = own_tokens if a.max_tokens_per_peer is None else a.max_tokens_per_peer
        self.peer_log = RateLimitedLog(log or logging.getLogger("swarm_node.node"), burst=5, period_s=60.0)

    def accepts_peer(self, m: Any) -> bool:
        """Whom to push to and download from (a member record): GRPO peers of our task and tokenizer."""
        return m.mode == "grpo" and m.task_id == self.expect.task_id and m.tokenizer_fp == self.expect.tokenizer_fp

    def download_rank(self, peer_id: str) -> int:
        """The swarm's rank of a peer (`SwarmPeer(rank=...)`, called on the event-loop and heartbeat threads):
        0 for an identity the newcomer gate has established, 1 for one warming up (its batch passed in at
        least one round), 2 for a stranger. Download slots treat every rank above 0 as a stranger, so
        identities that announce and never deliver queue behind the peers that have delivered; sampled
        membership pushes to lower ranks first (swarm.sampling.pick_targets). It only reads the gate."""
        if self.newcomers.established(peer_id):
            return 0
        return 1 if self.newcomers.rounds_passed(peer_id) else 2

    def choose(self, offers: list, k: int) -> list[int]:
        """Which of the buffered offers a round takes (the newcomer gate's share), for `SwarmPeer.receive`."""
        return self.newcomers.choose(offers, k)

    def remember_own(self, round_: int, groups: list[TrainGroup]) -> None:
        """Our own samples of this round: sent back to us by anyone, they count once."""
        self.replay.remember(round_, groups)

    def admit(self, batches: Sequence[Any], round_: int) -> AdmittedRound:
        """The groups to train on from this round's received batches (`swarm.Received`), and the rejections."""
        out = AdmittedRound()
        rejected = out.rejected
        gate = self.newcomers
        if gate.passed_over:  # newcomers beyond this round's share stayed in the buffer (`choose`)
            rejected.add("newcomer_capped", gate.passed_over)
            gate.passed_over = 0
        gate.start_round(round_)
        for rec in sorted(batches, key=lambda b: gate.rank(b.peer_id)):
            if not gate.admit(rec.peer_id):
                rejected.add("newcomer_capped")
                continue
            groups = self._admit_one(rec, round_, out)
            if groups is None:
                continue
            out.groups.extend(groups)
            if groups:
                out.batch_ages_s.append(rec.age_s)
                out.version_lags.append(rec.version_lag)
            name = rec.member.model_name if rec.member else ""
            key = f"{rec.peer_id[-8:]}:{name}" if name else rec.peer_id
            out.groups_by_peer[key] = out.groups_by_peer.get(key, 0) + len(groups)
        return out

    def _admit_one(self, rec: Any, round_: int, out: AdmittedRound) -> list[TrainGroup] | None:
        """One batch through conversion and the defences -> its groups to train on (None: refused whole)."""
        rejected = out.rejected
        decoded = rec.decoded  # decoded and checked on the decode thread as it arrived (`payload_check`)
        if decoded is None:  # the swarm buffers only checked batches; never train on one that was not
            rejected.add("swarm:validate_error")
            self.peer_log.warning("validate_error", "batch from %s arrived unchecked; refused", rec.peer_id)
            return None
        conv = peer_groups(decoded, rec.peer_id, self.task, self.tokenizer, self.expect, encode=self.encode)
        rejected.update(conv.rejected)
        out.rewards_overridden += conv.rewards_changed
        if conv.rejected:
            self.peer_log.warning("declined", "declined %s from %s", dict(conv.rejected), rec.peer_id)
        groups, replayed = self.replay.admit(round_, conv.groups)
        rejected.update(replayed)
        groups, capped = cap_share(groups, self.max_groups_per_peer)
        rejected.add("share_capped", capped)
        groups, capped = cap_tokens(groups, self.max_tokens_per_peer)
        rejected.add("token_capped", capped)
        if not groups:
            return groups
        recomputed = self.recompute(groups)
        ok, stat, limit = self.audit.judge(groups, recomputed)
        if not ok:
            rejected.add("logprob_outlier")
            self.peer_log.warning("logprob_outlier", "declined batch from %s: mean capped weight %.3f > %.3f",
                                  rec.peer_id, stat, limit)
            return None
        ok, gap, lower = self.skew.judge(rec.peer_id, groups, recomputed)
        if not ok:
            rejected.add("logprob_skew")
            self.peer_log.warning("logprob_skew", "declined batch from %s: positive-advantage log-ratio gap "
                                  "%.3f (lower bound %.3f) > %.2f", rec.peer_id, gap, lower, self.skew.tolerance)
            return None
        self.newcomers.passed(rec.peer_id, round_, completions=sum(len(g.completions) for g in groups))
        return groups
