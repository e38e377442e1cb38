"""Federated averaging through hivemind's DecentralizedAverager (butterfly all-reduce).

It runs on a DHT of its own (joined through the same bootstrap peers): the averager's matchmaking keys
are plain hivemind records, and the swarm layer's DHT is private to it. The group size is the number of
live participants; the averager is rebuilt when that number changes.

A step is not retried: a retry would join the group of the next round. A step whose average came back
incomplete fails (checked_averager.py), and the node keeps its own parameters for that round (dpo/mixing.py
`allreduce_result` turns a step into the round's result). Each member
sends its swarm peer id with the step, so a row lists the peers it really averaged with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from swarm_node.config import DPOConfig, SwarmConfig
from swarm_node.errors import UserFacingError
from swarm_node.swarm.averaging.payload import COMPRESSIONS

log = logging.getLogger("swarm_node.dpo")


def group_settings(n: int) -> dict[str, Any]:
    """Matchmaking settings of an averager whose group is all `n` live participants (tests build a
    groupmate with the same ones, or it never joins the node's group)."""
    return {"target_group_size": n, "min_group_size": n, "min_matchmaking_time": 2.0, "request_timeout": 1.0}


@dataclass(frozen=True)
class GroupMean:
    """One all-reduce step's outcome: the group's mean, the group's size (us included) and our groupmates."""

    mean: list[torch.Tensor]
    size: int
    present: list[str]


class AllReduce:
    def __init__(self, d: DPOConfig, swarm: SwarmConfig, params: list[torch.Tensor], arch_fp: str) -> None:
        import hivemind

        if d.compression == "uint8":
            raise UserFacingError("dpo.compression=uint8 does not work with dpo.federated_backend=allreduce "
                                  "(hivemind 1.1.12's 8-bit decoder fails under numpy 2); use float16, or "
                                  "dpo.federated_backend=published")
        self.d = d
        self.client_mode = swarm.client_mode
        self.template = [t.clone() for t in params]
        self.prefix = f"{swarm.swarm_id}_dpo_{arch_fp}"
        self.dht = hivemind.DHT(initial_peers=list(swarm.initial_peers) or None, start=True,
                                host_maddrs=list(swarm.host_maddrs), client_mode=swarm.client_mode)
        self.averager: Any = None
        self.group_size = 0

    def _ensure(self, n: int) -> Any:
        from swarm_node.swarm.averaging.checked_averager import CheckedAverager

        if self.averager is None or n != self.group_size or not self.averager.is_alive():
            if self.averager is not None:
                self.averager.shutdown()
            self.averager = CheckedAverager(
                [t.clone() for t in self.template], self.dht, start=True, prefix=self.prefix, **group_settings(n),
                allreduce_timeout=self.d.gossip_deadline_s,
                compression=COMPRESSIONS[self.d.compression], client_mode=self.client_mode,
            )
            self.group_size = n
        return self.averager

    def average(self, own: list[torch.Tensor], n: int, me: str) -> GroupMean | None:
        """The mean over a group of all `n` participants (up to compression error) and the groupmates'
        swarm peer ids; None if no group formed in time, or its average came back incomplete or not finite.
        The DPO round turns this into its round's result (dpo/mixing.py `allreduce_result`)."""
        av = self._ensure(n)
        with av.get_tensors() as ts:
            for t, x in zip(ts, own, strict=True):
                t.copy_(x)
        deadline = self.d.gossip_deadline_s
        control = av.step(gather=me, timeout=deadline, allow_retries=False, wait=False)
        try:  # matchmaking is bounded by the deadline and the all-reduce by allreduce_timeout; this bounds the rest
            group = control.result(timeout=2 * deadline + 5)
        except Exception as exc:  # AllreduceException (no group, incomplete), TimeoutError (stalled all-reduce)
            control.cancel()
            log.warning("all-reduce failed: %s", repr(exc) if isinstance(exc, TimeoutError) else exc)
            group = None
        if group is None:
            return None
        with av.get_tensors() as ts:
            mean = [t.detach().clone() for t in ts]
        if not all(torch.isfinite(t).all() for t in mean):
            log.warning("all-reduce result is not finite; keeping our own parameters")
            return None
        return GroupMean(mean, len(group), group_members(group.values(), me))

    def close(self) -> None:
        if self.averager is not None:
            self.averager.shutdown()
        self.dht.shutdown()


def group_members(gathered: Any, me: str) -> list[str]:
    """The swarm peer ids the groupmates sent with the step, other than ours (anything else: "unknown")."""
    ids = {g if isinstance(g, str) and 0 < len(g) <= 128 else "unknown" for g in gathered}
    return sorted(ids - {me})
