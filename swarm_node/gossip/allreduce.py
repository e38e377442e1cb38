"""Federated averaging through hivemind's DecentralizedAverager (butterfly all-reduce).

It runs on a DHT of its own (joined through the same bootstrap peers): the averager's matchmaking keys
are plain hivemind records, and the swarm layer's DHT is private to it. The group size is the number of
live participants; the averager is rebuilt when that number changes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from swarm_node.config import DPOConfig, SwarmConfig
from swarm_node.errors import UserFacingError
from swarm_node.gossip.mixing import GossipResult
from swarm_node.gossip.payload import COMPRESSIONS
from swarm_node.gossip.vectors import params_sq_distance

log = logging.getLogger("swarm_node.dpo")


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
        import hivemind

        if self.averager is None or n != self.group_size:
            if self.averager is not None:
                self.averager.shutdown()
            self.averager = hivemind.averaging.DecentralizedAverager(
                [t.clone() for t in self.template], self.dht, start=True, prefix=self.prefix,
                target_group_size=n, min_group_size=n, min_matchmaking_time=2.0, request_timeout=1.0,
                compression=COMPRESSIONS[self.d.compression], client_mode=self.client_mode,
            )
            self.group_size = n
        return self.averager

    def average(self, own: list[torch.Tensor], participants: list[str], me: str) -> GossipResult:
        """The group mean (up to compression error), or our own params if no full group formed in time."""
        others = [p for p in participants if p != me]
        n = len(participants)
        if n < 2:
            return GossipResult(own, {me: 1.0}, [], [], 0.0)
        av = self._ensure(n)
        with av.get_tensors() as ts:
            for t, x in zip(ts, own, strict=True):
                t.copy_(x)
        try:
            group = av.step(timeout=self.d.gossip_deadline_s, allow_retries=True)
        except Exception as exc:  # hivemind raises AllreduceException when no group formed
            log.warning("all-reduce failed: %s", exc)
            group = None
        if group is None:
            return GossipResult(own, {me: 1.0}, [], others, 0.0)
        with av.get_tensors() as ts:
            mean = [t.detach().clone() for t in ts]
        if not all(torch.isfinite(t).all() for t in mean):
            log.warning("all-reduce result is not finite; keeping our own parameters")
            return GossipResult(own, {me: 1.0}, [], others, 0.0)
        k = len(group)  # others' mean = (k * mean - own) / (k - 1)
        others_mean = [(k * m - x) / max(k - 1, 1) for m, x in zip(mean, own, strict=True)]
        dist = params_sq_distance(own, others_mean) ** 0.5
        return GossipResult(mean, {p: 1.0 / k for p in participants}, others, [], dist)

    def close(self) -> None:
        if self.averager is not None:
            self.averager.shutdown()
        self.dht.shutdown()
