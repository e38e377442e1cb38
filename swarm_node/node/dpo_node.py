"""The DPO node's round loop: E local DPO steps, publish params, fetch neighbours', average, log metrics.

Gossip mode builds the topology every round from the sorted ids of the live DPO peers with our
architecture fingerprint, so all nodes that see the same membership agree on the graph without talking.
Federated mode takes the exact mean over all participants, by hivemind's DecentralizedAverager
all-reduce or from everyone's published parameters (S of them, sampled from a seed every node shares,
when participants_per_round is set); see docs/dpo.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarm_node import topology as T
from swarm_node.config import NodeConfig
from swarm_node.errors import UserFacingError
from swarm_node.node import averaging as A
from swarm_node.node.logs import setup_logging
from swarm_node.node.metrics import MetricsWriter
from swarm_node.node.stopping import StopFlag
from swarm_node.tasks.preferences import node_preferences
from swarm_node.training.dpo import DPOTrainer, HeldOut
from swarm_node.training.lr_schedule import lr_factor
from swarm_node.training.optim import set_lr

log = logging.getLogger("swarm_node.dpo")

TINY_PARAMS = 5_000_000  # below this, one CPU thread is faster than several (measured ~10x on 2 busy cores)


def _default_lr(cfg: NodeConfig, loaded: Any) -> float:
    if cfg.dpo.lr is not None:
        return cfg.dpo.lr
    if loaded.meta.get("preset") or cfg.model.path.startswith("tiny-"):
        return 3e-3
    return 1e-4 if loaded.is_lora else 1e-6


class _Exchange:
    """The swarm side of one node: peers that can average with us, and parallel parameter fetches."""

    def __init__(self, cfg: NodeConfig, swarm: Any, arch_fp: str) -> None:
        self.cfg = cfg
        self.swarm = swarm
        self.arch_fp = arch_fp
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="dpo-fetch")

    @property
    def self_id(self) -> str:
        return self.swarm.peer_id if self.swarm else "self"

    def peers(self) -> list[str]:
        """Sorted ids of live DPO peers with our architecture fingerprint, self included."""
        if self.swarm is None:
            return [self.self_id]
        ids = {m.peer_id for m in self.swarm.live_peers() if m.mode == "dpo" and m.arch_fp == self.arch_fp}
        return sorted(ids | {self.self_id})

    def wait_for_peers(self, stop: StopFlag) -> list[str]:
        end = time.monotonic() + self.cfg.dpo.join_wait_s
        ids = self.peers()
        while len(ids) < self.cfg.dpo.min_peers and time.monotonic() < end and not stop:
            time.sleep(0.5)
            ids = self.peers()
        log.info("%d DPO peer(s) with our architecture (min_peers %d)", len(ids), self.cfg.dpo.min_peers)
        return ids

    def fetch_all(self, peers: list[str], round_: int) -> dict[str, bytes | None]:
        if not peers or self.swarm is None:
            return {}
        deadline = self.cfg.dpo.gossip_deadline_s
        futs = {p: self.pool.submit(self.swarm.fetch, "params", p, round_, deadline) for p in peers}
        return {p: f.result() for p, f in futs.items()}

    def linger(self, done_round: int, neighbours: list[str]) -> None:
        """Keep serving our last params until the neighbours have finished that round too (bounded).

        A node that left at once would make slower neighbours time out on the final round.
        """
        if self.swarm is None or not neighbours:
            return
        self.swarm.set_round(done_round)
        end = time.monotonic() + self.cfg.dpo.gossip_deadline_s
        while time.monotonic() < end:
            rounds = {m.peer_id: m.round for m in self.swarm.live_peers()}
            if all(rounds.get(p, done_round) >= done_round for p in neighbours):
                return
            time.sleep(0.5)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.swarm is not None:
            self.swarm.close()


class _AllReduce:
    """Federated averaging through hivemind's DecentralizedAverager (butterfly all-reduce).

    It runs on a DHT of its own (joined through the same bootstrap peers): the averager's matchmaking keys
    are plain hivemind records, and the swarm layer's DHT is private to it. The group size is the number
    of live participants; the averager is rebuilt when that number changes.
    """

    def __init__(self, cfg: NodeConfig, params: list[torch.Tensor], arch_fp: str) -> None:
        import hivemind

        if cfg.dpo.compression == "uint8":
            raise UserFacingError("dpo.compression=uint8 does not work with dpo.federated_backend=allreduce "
                                  "(hivemind 1.1.12's 8-bit decoder fails under numpy 2); use float16, or "
                                  "dpo.federated_backend=published")
        self.cfg = cfg
        self.template = [t.clone() for t in params]
        self.prefix = f"{cfg.swarm.swarm_id}_dpo_{arch_fp}"
        self.dht = hivemind.DHT(initial_peers=list(cfg.swarm.initial_peers) or None, start=True,
                                host_maddrs=list(cfg.swarm.host_maddrs), client_mode=cfg.swarm.client_mode)
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
                compression=A.COMPRESSIONS[self.cfg.dpo.compression],
                client_mode=self.cfg.swarm.client_mode,
            )
            self.group_size = n
        return self.averager

    def average(self, own: list[torch.Tensor], participants: list[str], me: str) -> A.GossipResult:
        """The group mean (up to compression error), or our own params if no full group formed in time."""
        others = [p for p in participants if p != me]
        n = len(participants)
        if n < 2:
            return A.GossipResult(own, {me: 1.0}, [], [], 0.0)
        av = self._ensure(n)
        with av.get_tensors() as ts:
            for t, x in zip(ts, own, strict=True):
                t.copy_(x)
        try:
            group = av.step(timeout=self.cfg.dpo.gossip_deadline_s, allow_retries=True)
        except Exception as exc:  # hivemind raises AllreduceException when no group formed
            log.warning("all-reduce failed: %s", exc)
            group = None
        if group is None:
            return A.GossipResult(own, {me: 1.0}, [], others, 0.0)
        with av.get_tensors() as ts:
            mean = [t.detach().clone() for t in ts]
        if not all(torch.isfinite(t).all() for t in mean):
            log.warning("all-reduce result is not finite; keeping our own parameters")
            return A.GossipResult(own, {me: 1.0}, [], others, 0.0)
        k = len(group)  # others' mean = (k * mean - own) / (k - 1)
        others_mean = [(k * m - x) / max(k - 1, 1) for m, x in zip(mean, own, strict=True)]
        dist = A.params_sq_distance(own, others_mean) ** 0.5
        return A.GossipResult(mean, {p: 1.0 / k for p in participants}, others, [], dist)

    def close(self) -> None:
        if self.averager is not None:
            self.averager.shutdown()
        self.dht.shutdown()


def _plan_round(cfg: NodeConfig, ids: list[str], me: str, round_: int) -> tuple[np.ndarray, list[str], list[str]]:
    """(adjacency over ids, peers to fetch from, federated participants) for this round."""
    n = len(ids)
    d = cfg.dpo
    if d.averaging == "federated":
        participants = ids
        if d.participants_per_round is not None and d.participants_per_round < n:
            rng = np.random.default_rng([d.graph_seed, round_])
            participants = sorted(rng.choice(ids, size=d.participants_per_round, replace=False).tolist())
        return T.complete(n), [p for p in participants if p != me], participants
    if d.averaging == "none" or n == 1:
        return np.zeros((n, n), dtype=bool), [], []
    adj = T.adjacency(d.topology, n, p=d.er_probability, seed=d.graph_seed)
    return adj, [ids[j] for j in np.flatnonzero(adj[ids.index(me)])], []


@dataclass
class _Node:
    """Everything one round needs, built once at start."""

    cfg: NodeConfig
    model: Any
    trainer: DPOTrainer
    heldout: HeldOut
    ex: _Exchange
    arch_fp: str
    shapes: list
    user: int | None
    allreduce: _AllReduce | None = None
    metrics: MetricsWriter | None = None
    rejects: A.RejectCounter = field(default_factory=A.RejectCounter)
    last_stats: dict = field(default_factory=lambda: {"bytes_in": 0, "bytes_out": 0})

    def round(self, r: int, evaluate: Callable[[], bool]) -> tuple[dict, A.GossipResult]:
        """E local steps -> publish -> fetch the same round from neighbours -> average -> metrics row.

        `evaluate` is asked after averaging, so a round interrupted by a signal is still evaluated.
        """
        d, swarm, t0 = self.cfg.dpo, self.ex.swarm, time.time()
        if swarm:
            swarm.set_round(r)
        t = self.cfg.training  # the shared lr schedule: training.lr_schedule / warmup_rounds, over DPO rounds
        set_lr(self.trainer.optimizer, self.trainer.optimizer.defaults["lr"] *
               lr_factor(t.lr_schedule, r, t.warmup_rounds, self.cfg.rounds))
        step = self.trainer.local_steps(d.local_steps)
        own = A.get_params(self.model)
        payload = A.encode_params(own, self.arch_fp, d.compression)
        ids = self.ex.peers()
        me = self.ex.self_id
        adj, to_fetch, participants = _plan_round(self.cfg, ids, me, r)
        if self.allreduce is not None:
            to_fetch = []
        elif swarm:
            swarm.publish("params", r, payload)
        received = self.ex.fetch_all(to_fetch, r)
        limit = self.cfg.swarm.max_batch_bytes
        allreduce_bytes = 0
        if self.allreduce is not None:
            res = self.allreduce.average(own, participants, me)
            k = len(res.present) + 1  # butterfly all-reduce: each node sends and receives 2 (k-1)/k payloads
            allreduce_bytes = int(2 * (k - 1) / k * len(payload)) if res.present else 0
        elif d.averaging == "federated":
            res = A.federated_step(me, payload, received, participants, self.shapes, self.arch_fp, d.compression,
                                   self.rejects, limit)
        else:
            res = A.gossip_step(me, payload, received, ids, adj, self.shapes, self.arch_fp, d.compression,
                                self.rejects, limit)
        A.set_params(self.model, res.params)
        ev = self.heldout.evaluate(self.model, d.beta) if evaluate() else {"heldout_pref_acc": None,
                                                                          "heldout_dpo_loss": None}
        stats = swarm.stats() if swarm else self.last_stats
        row = {
            "round": r,
            "dpo_loss": step.loss,
            "lr": self.trainer.optimizer.param_groups[0]["lr"],
            "train_pref_acc": step.accuracy,
            **ev,
            "consensus_distance": res.consensus_distance,
            "bytes_sent": stats["bytes_out"] - self.last_stats["bytes_out"] + allreduce_bytes,
            "bytes_received": stats["bytes_in"] - self.last_stats["bytes_in"] + allreduce_bytes,
            "payload_bytes": len(payload),
            "params_digest": A.params_digest(res.params),
            "params_probe": A.params_probe(res.params),
            "graph": d.topology if d.averaging == "gossip" else d.averaging,
            "spectral_gap": T.spectral_gap(T.mixing_matrix_from_adjacency(adj)) if len(ids) > 1 else 1.0,
            "num_peers": len(ids),
            "neighbours": res.present,
            "missing_neighbours": res.missing,
            "weights": res.weights,
            "rejected": dict(self.rejects.counts),
            "user": self.user,
            "peer_id": me,
            "seconds": round(time.time() - t0, 3),
        }
        self.last_stats = stats
        return row, res


def _build(cfg: NodeConfig) -> _Node:
    from swarm_node.models.loading import load_model

    d = cfg.dpo
    torch.manual_seed(cfg.seed)
    lora = cfg.model.lora if cfg.model.lora.enabled else None
    loaded = load_model(cfg.model.path, dtype=cfg.model.dtype, device=cfg.model.device, lora=lora, name=cfg.model.name)
    model, tok = loaded.model, loaded.tokenizer
    if loaded.device.type == "cpu" and sum(p.numel() for p in model.parameters()) < TINY_PARAMS:
        torch.set_num_threads(1)
    data = node_preferences(d.data_path, d.eval_data_path, user=d.user, seed=cfg.seed, num_users=d.num_users,
                            pairs_per_user=d.pairs_per_user, heldout_pairs=d.heldout_pairs)
    trainer = DPOTrainer(model, tok, data.train, beta=d.beta, lr=_default_lr(cfg, loaded), batch_size=d.batch_size,
                         max_length=d.max_length, grad_clip=cfg.training.grad_clip, seed=cfg.seed)
    heldout = HeldOut(model, tok, data.heldout, d.max_length)
    arch_fp = A.arch_fingerprint(model)
    swarm = None
    if cfg.swarm.enabled and d.averaging != "none":
        from swarm_node.swarm import PeerInfo, SwarmNode

        info = PeerInfo(mode="dpo", model_name=loaded.name, tokenizer_fp=loaded.tokenizer_fp, task_id=data.task_id,
                        arch_fp=arch_fp)
        swarm = SwarmNode(cfg.swarm, info, logger=logging.getLogger("swarm_node.swarm")).start()
    log.info("DPO node: user %s, %d train / %d held-out pairs, %s averaging on %s, arch %s",
             data.user, len(data.train), len(data.heldout), d.averaging, d.topology, arch_fp)
    shapes = [p.shape for _, p in A.trainable_named(model)]
    node = _Node(cfg, model, trainer, heldout, _Exchange(cfg, swarm, arch_fp), arch_fp, shapes, data.user)
    if swarm:
        node.last_stats = swarm.stats()
        if d.averaging == "federated" and d.federated_backend == "allreduce" and d.participants_per_round is None:
            try:
                node.allreduce = _AllReduce(cfg, A.get_params(model), arch_fp)
            except BaseException:
                node.ex.close()
                raise
    return node


def run_dpo_node(cfg: NodeConfig, state_dir: Path, log_level: str = "info") -> int:
    """Run DPO rounds until cfg.rounds or a signal; one JSON line per round in state_dir/metrics.jsonl."""
    setup_logging(log_level)
    node = _build(cfg)
    stop = StopFlag().install()
    r, neighbours = 0, []
    try:
        node.ex.wait_for_peers(stop)
        metrics = node.metrics = MetricsWriter.from_config(Path(state_dir), cfg, node_name=node.ex.self_id)
        metrics.truncate_after(-1)  # DPO mode has no resume: a run starts at round 0
        # The stop decision is taken once per round, when the round is evaluated: a signal that lands after
        # that point is seen by the next round, which then runs to its end and is evaluated. So the last
        # logged row always carries a held-out evaluation, whenever the signal arrives.
        stopping = bool(stop)
        while not stopping and (cfg.rounds is None or r < cfg.rounds):
            due = r % cfg.metrics.eval_every == 0 or r == (cfg.rounds or 0) - 1
            decided: dict[str, bool] = {}

            def evaluate(due: bool = due, decided: dict = decided) -> bool:
                decided["stop"] = bool(stop)
                return due or decided["stop"]

            row, res = node.round(r, evaluate=evaluate)
            metrics.write(row)
            log.info("round %d: loss %.4f held-out acc %s consensus %.4f neighbours %d missing %d", r,
                     row["dpo_loss"], row["heldout_pref_acc"], row["consensus_distance"], len(res.present),
                     len(res.missing))
            r, neighbours, stopping = r + 1, res.present, decided["stop"]
        node.ex.linger(r, neighbours)
    finally:
        if node.metrics is not None:
            node.metrics.close()
        if node.allreduce is not None:
            node.allreduce.close()
        node.ex.close()
        stop.restore()
    log.info("DPO node stopped after %d rounds", r)
    return 0
