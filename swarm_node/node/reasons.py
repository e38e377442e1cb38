"""Every reason a node counts a refused peer batch, group or payload under: one registry.

A round's `rejected` dict in metrics.jsonl, the `swarm_node_rejected_total{reason=...}` Prometheus series and
the report's table of rejections all read their names and meanings from here. Reasons are fixed names
chosen by this code, never by a peer, so the exported label set stays bounded.

- The node's own reasons (`REASONS`), named where they are counted (grpo/admission.py, grpo/rollouts.py,
  the GRPO round's out-of-memory fallback).
- Families named by a layer below, counted as `<family>:<reason>`: `protocol:` the wire decoder's refusals
  (`swarm_node.protocol.errors.REASONS`), `swarm:` the swarm layer's refusals of records, announcements,
  transfers and of a validator that misbehaved (`swarm_node.swarm.reasons.REJECTED`), `params:` a DPO
  neighbour's parameters refused (`PARAM_REASONS`).

`Rejections` is the per-round counter: it refuses a name this registry lacks, so a reason cannot be emitted
without being documented and exported (tests/test_reasons.py also checks every reason literal in the node's
source against the registry).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from swarm_node.protocol.errors import REASONS as PROTOCOL_REASONS
from swarm_node.swarm.averaging.reasons import (
    PARAM_REASONS,  # the `params:` family: the DPO payload codec names them
)
from swarm_node.swarm.reasons import REJECTED as SWARM_REASONS

REASONS: dict[str, str] = {
    # the decode thread's payload check (grpo/admission.py check_payload), before the batch is buffered
    "round_mismatch": "the payload's round is not the round its announcement named",
    # a peer batch against what this node can use (grpo/rollouts.py peer_groups): whole batch
    "swarm_mismatch": "batch of another swarm id",
    "task_mismatch": "batch of another task",
    "tokenizer_mismatch": "batch tokenized with another tokenizer",
    "vocab_mismatch": "batch whose vocabulary is larger than this model's",
    # ... one group at a time
    "duplicate_group": "a second group for the same prompt id in one batch",
    "unknown_prompt": "a prompt id this task cannot rebuild",
    "prompt_mismatch": "prompt token ids differ from this node's encoding of the rebuilt prompt",
    "group_too_small": "a group with fewer than two completions (no advantage to compute)",
    "reward_out_of_range": "a claimed reward that is not finite or too large (only with trust_peer_rewards)",
    # the defences (grpo/defences.py), driven by grpo/admission.py
    "newcomer_capped": "a batch of an identity not yet established, beyond this round's newcomer slots",
    "duplicate_completion": "a completion already seen this window (a replay, maybe under another identity)",
    "replayed_group": "a group left with fewer than two fresh completions after removing replays",
    "share_capped": "groups of one identity beyond this node's own prompts per round",
    "token_capped": "groups of one identity beyond this node's own completion tokens per round",
    "logprob_outlier": "claimed log-probs that make the mean capped importance weight too large",
    "logprob_skew": "claimed log-probs lowered on positive-advantage completions (running per-peer test)",
    # training
    "oom_external": "peer groups dropped because training on them ran out of memory even one sequence at a time "
                    "(the round retrains alone)",
}

FAMILIES: dict[str, str] = {
    "protocol": "the wire decoder refused the batch",
    "swarm": "the swarm layer refused it (record, announcement, transfer, or a validator that raised)",
    "params": "a DPO parameter payload was refused",
}


def known(reason: str) -> bool:
    """Is `reason` a name this node may count (and export)?"""
    if reason in REASONS:
        return True
    family, sep, name = reason.partition(":")
    if not sep or not name:
        return False
    if family == "protocol":
        return name in PROTOCOL_REASONS
    if family == "params":
        return name in PARAM_REASONS
    return family == "swarm" and name in SWARM_REASONS


def describe(reason: str) -> str:
    """One line on what a reason means, for the report; "" for a name this registry lacks."""
    if reason in REASONS:
        return REASONS[reason]
    family, _, name = reason.partition(":")
    if not known(reason):
        return ""
    if family == "params":
        return f"{FAMILIES[family]}: {PARAM_REASONS[name]}"
    return f"{FAMILIES[family]} ({name})"


def from_swarm(rejected: Mapping[str, int], payload_refused: Mapping[str, int]) -> Rejections:
    """What a round's `swarm.RoundIntake` hands up, as this registry's names.

    `rejected`: the swarm's own refusals (names of swarm.reasons.REJECTED), counted as `swarm:<reason>`.
    `payload_refused`: our validator's refusals on the decode thread (`protocol:*`, `round_mismatch`),
    counted as they are; a name this registry lacks (a bug of the validator) is counted as
    `swarm:validate_error`, the swarm's reason for a validator that misbehaved, so it never stops a round.
    """
    out = Rejections()
    for reason, n in rejected.items():
        out.add(f"swarm:{reason}" if known(f"swarm:{reason}") else "swarm:validate_error", n)
    for reason, n in payload_refused.items():
        out.add(reason if known(reason) else "swarm:validate_error", n)
    return out


class UnknownReason(AssertionError):
    """Code tried to count a reason the registry lacks: add it to REASONS (with its meaning) first."""


class Rejections(Counter):
    """Counts refusals by reason; only reasons of this registry (see `known`) can be counted."""

    def __setitem__(self, reason: str, count: int) -> None:
        if not known(reason):
            raise UnknownReason(f"rejection reason {reason!r} is not in swarm_node/node/reasons.py")
        super().__setitem__(reason, count)

    def update(self, other: Mapping[str, int] | Iterable[str] = (), /, **kwargs: int) -> None:
        """As Counter.update, through the check (dict.update would bypass `__setitem__`)."""
        counts = other if isinstance(other, Mapping) else Counter(other)
        for reason, n in [*counts.items(), *kwargs.items()]:
            self.add(reason, n)

    def add(self, reason: str, n: int = 1) -> None:
        if n:
            self[reason] = self.get(reason, 0) + n
