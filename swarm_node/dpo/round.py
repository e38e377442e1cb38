"""The DPO round: E local DPO steps, publish params, fetch neighbours', average, evaluate, metrics row.

`DPONode` holds one node's state between rounds; its lifecycle (resume from the newest readable
checkpoint, join, rounds, checkpoints, stop, leave) is the loop both modes share (node/loop.py), started
by `run_dpo_node`. Who averages with whom is decided in `swarm_node/dpo/neighbours.py`, the averaging
math is `dpo/mixing.py`.

Rounds are numbered from 0 (round 0 already trains; gossip rounds are matched by number). A checkpoint of
round r holds the parameters after round r's average, the optimizer and the batch sampler's RNG, so a
restart continues at round r + 1 with bit-identical state. A gossip node that was away catches up with
its neighbours' round instead of asking them for rounds they have long finished.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from swarm_node.config import NodeConfig
from swarm_node.dpo import mixing, topology
from swarm_node.dpo.bypass import STALL_HOLD, Bypass
from swarm_node.dpo.neighbours import Neighbourhood, RoundPlan, plan_round
from swarm_node.dpo.robust import RobustAverager
from swarm_node.dpo.vectors import arch_fingerprint, get_params, params_digest, params_probe, set_params
from swarm_node.node.loop import RoundNode, run_node
from swarm_node.node.metrics import MetricsWriter
from swarm_node.node.progress import RoundProgress, dpo_round_line
from swarm_node.node.reasons import Rejections
from swarm_node.node.rows import DPORow
from swarm_node.node.stopping import StopFlag
from swarm_node.swarm.averaging.allreduce import AllReduce
from swarm_node.swarm.averaging.payload import encode_params
from swarm_node.tasks.preferences import node_preferences
from swarm_node.training.dpo import DPOTrainer, HeldOut
from swarm_node.training.params import trainable_named

log = logging.getLogger("swarm_node.dpo")

TINY_PARAMS = 5_000_000  # below this, one CPU thread is faster than several (measured ~10x on 2 busy cores)


class DPONode(RoundNode):
    """State of one DPO node between rounds (`last_round`: node/loop.py)."""

    MODE = "DPO"
    FIRST_ROUND = 0
    EVALUATES_ON_STOP = True  # the held-out eval is a few forward passes

    def __init__(self, cfg: NodeConfig, state_dir: Path) -> None:
        from swarm_node.models.loading import load_model

        super().__init__(cfg, state_dir)
        d = cfg.dpo
        lora = cfg.model.lora if cfg.model.lora.enabled else None
        self.loaded = load_model(cfg.model.path, dtype=cfg.model.dtype, device=cfg.model.device, lora=lora,
                                 name=cfg.model.name)
        self.model, tok = self.loaded.model, self.loaded.tokenizer
        if self.loaded.device.type == "cpu" and sum(p.numel() for p in self.model.parameters()) < TINY_PARAMS:
            torch.set_num_threads(1)
        self.data = node_preferences(d.data_path, d.eval_data_path, user=d.user, seed=cfg.seed,
                                     num_users=d.num_users, pairs_per_user=d.pairs_per_user,
                                     heldout_pairs=d.heldout_pairs)
        # Both take their reference log-probs from the model as loaded, before any checkpoint is restored:
        # the DPO reference is the initial policy, on a fresh start and on a resume alike.
        self.trainer = DPOTrainer(self.model, tok, self.data.train, beta=d.beta, lr=self.loaded.default_lr("dpo", d.lr),
                                  batch_size=d.batch_size, max_length=d.max_length,
                                  grad_clip=cfg.training.grad_clip, seed=cfg.seed)
        self.heldout = HeldOut(self.model, tok, self.data.heldout, d.max_length)
        self.arch_fp = arch_fingerprint(self.model)
        self.shapes = [p.shape for _, p in trainable_named(self.model)]
        self.metrics = MetricsWriter.from_config(self.state_dir, cfg, node_name=self.loaded.name)
        self.neighbourhood = Neighbourhood(d, None, self.arch_fp)
        self.allreduce: AllReduce | None = None
        self.rejects = mixing.RejectCounter()  # running totals; rows carry each round's change
        self._rejects_before: Counter = Counter()
        self.robust = RobustAverager.from_config(d)  # None: plain averaging (dpo.aggregation=mean)
        # gossip: route around neighbours that stay missing or refused, and widen a stalled neighbourhood
        self.bypass = Bypass.from_config(d)
        self.last_stats = {"bytes_in": 0, "bytes_out": 0}
        self._start_rounds()
        self.neighbours: list[str] = []
        log.info("DPO node: user %s, %d train / %d held-out pairs, %s averaging on %s, arch %s", self.data.user,
                 len(self.data.train), len(self.data.heldout), d.averaging, d.topology, self.arch_fp)

    # ---- lifecycle (the loop itself: node/loop.py) ---------------------------------------------------

    def checkpoint_record(self) -> dict:
        return {"model_name": self.loaded.name, "is_lora": self.loaded.is_lora, "user": self.data.user}

    def progress(self) -> RoundProgress:
        return RoundProgress(f"{self.loaded.name} dpo", self.cfg.rounds, describe=dpo_round_line,
                             accuracy_key="heldout_pref_acc")

    def join(self, stop: StopFlag) -> None:
        if not self.cfg.swarm.enabled or self.cfg.dpo.averaging == "none":
            return
        self.join_swarm()
        self.neighbourhood.wait_for_peers(lambda: bool(stop))
        if self.cfg.dpo.averaging == "gossip":
            self.catch_up()

    def join_swarm(self) -> None:
        from swarm_node.swarm import PeerInfo, SwarmPeer

        info = PeerInfo(mode="dpo", model_name=self.loaded.name, tokenizer_fp=self.loaded.tokenizer_fp,
                        task_id=self.data.task_id, arch_fp=self.arch_fp)
        # DPO takes no rollout batches: parameters come by fetch
        swarm = SwarmPeer(self.cfg.swarm, info, validate=None, params_cap=self.cfg.dpo.max_payload_bytes,
                          logger=logging.getLogger("swarm_node.swarm")).start()
        self.neighbourhood = Neighbourhood(self.cfg.dpo, swarm, self.arch_fp)
        swarm.set_round(self.last_round + 1)
        self.last_stats = swarm.stats()
        d = self.cfg.dpo
        if d.averaging == "federated" and d.federated_backend == "allreduce" and d.participants_per_round is None:
            self.allreduce = AllReduce(d, self.cfg.swarm, get_params(self.model), self.arch_fp)

    def catch_up(self) -> None:
        """After a restart, skip to the round the neighbours are in: they will not wait for us.

        Gossip rounds are matched by number, so a node that resumed at round 12 while its ring is at
        round 30 would fetch round-12 parameters nobody serves any more, and its neighbours would miss it
        in every round. Skipped rounds leave no metrics rows.
        """
        ahead = max(self.neighbourhood.peer_rounds().values(), default=-1)
        if ahead > self.last_round + 1:
            log.info("neighbours are at round %d: catching up from round %d", ahead, self.last_round + 1)
            self.last_round = ahead - 1

    def leave(self) -> None:
        self.neighbourhood.linger(self.last_round + 1, self.neighbours)

    def close(self) -> None:
        self.metrics.close()
        if self.allreduce is not None:
            self.allreduce.close()
            self.allreduce = None
        self.neighbourhood.close()

    # ---- one round ---------------------------------------------------------------------------------

    def run_round(self, evaluate: Callable[[], bool] | None = None) -> DPORow:
        """E local steps -> publish -> fetch the same round from neighbours -> average -> metrics row.

        `evaluate` is asked after averaging, so a round interrupted by a signal is still evaluated.
        """
        d, swarm, r, t0 = self.cfg.dpo, self.neighbourhood.swarm, self.last_round + 1, time.time()
        if swarm:
            swarm.set_round(r)
        self.apply_lr_schedule()  # training.lr_schedule / warmup_rounds, as in GRPO (node/loop.py)
        if self.robust is not None and not self.robust.anchored:  # our own update is measured from here
            self.robust.averaged(get_params(self.model))
        log.debug("round %d: %d local DPO steps", r, d.local_steps)  # fault tests watch this
        step = self.trainer.local_steps(d.local_steps)
        own = get_params(self.model)
        payload = encode_params(own, self.arch_fp, d.compression)
        ids = self.neighbourhood.peers()
        me = self.neighbourhood.self_id
        plan = plan_round(d, ids, me, r)
        around = sorted(self.bypass.routed_around() & set(ids)) if d.averaging == "gossip" else []
        if around:
            plan = RoundPlan.gossip(self.bypass.adjacency(plan.adjacency, ids, me), ids, me)
            log.debug("round %d: routing around %s", r, around)
        to_fetch = [] if self.allreduce is not None else plan.to_fetch
        if swarm and self.allreduce is None:
            swarm.publish("params", r, payload)
        received = self.neighbourhood.fetch_all(to_fetch, r)
        limit = d.max_payload_bytes
        allreduce_bytes = 0
        if self.allreduce is not None:
            res = mixing.allreduce_result(self.allreduce, own, plan.participants, me)
            k = len(res.present) + 1  # butterfly all-reduce: each node sends and receives 2 (k-1)/k payloads
            allreduce_bytes = int(2 * (k - 1) / k * len(payload)) if res.present else 0
        elif d.averaging == "federated":
            res = mixing.federated_step(me, payload, received, plan.participants, self.shapes, self.arch_fp,
                                        d.compression, self.rejects, limit, robust=self.robust)
        else:
            res = mixing.gossip_step(me, payload, received, ids, plan.adjacency, self.shapes, self.arch_fp,
                                     d.compression, self.rejects, limit, robust=self.robust)
            if self.bypass.observe(res.present, res.missing, res.pull_ratio):
                log.warning("round %d: averaging moved us %.2f of the way its neighbours pull, %d rounds in a row "
                            "(one may cancel the others: dissensus); also averaging with their graph neighbours "
                            "for %d rounds", r, res.pull_ratio, d.bypass_after, STALL_HOLD)
        set_params(self.model, res.params)
        due = evaluate() if evaluate is not None else self.eval_due(r)
        ev = self.heldout.evaluate(self.model, d.beta) if due else {"heldout_pref_acc": None, "heldout_dpo_loss": None}
        stats = swarm.stats() if swarm else self.last_stats
        gap = topology.spectral_gap(topology.mixing_matrix_from_adjacency(plan.adjacency)) if len(ids) > 1 else 1.0
        rejected = Rejections({f"params:{k}": n - self._rejects_before.get(k, 0)
                               for k, n in self.rejects.counts.items() if n > self._rejects_before.get(k, 0)})
        self._rejects_before = Counter(self.rejects.counts)
        row = DPORow(
            round=r,
            dpo_loss=step.loss,
            lr=self.trainer.optimizer.param_groups[0]["lr"],
            train_pref_acc=step.accuracy,
            heldout_pref_acc=ev["heldout_pref_acc"],
            heldout_dpo_loss=ev["heldout_dpo_loss"],
            consensus_distance=res.consensus_distance,
            bytes_sent=stats["bytes_out"] - self.last_stats["bytes_out"] + allreduce_bytes,
            bytes_received=stats["bytes_in"] - self.last_stats["bytes_in"] + allreduce_bytes,
            payload_bytes=len(payload),
            params_digest=params_digest(res.params),
            params_probe=params_probe(res.params),
            graph=d.topology if d.averaging == "gossip" else d.averaging,
            spectral_gap=gap,
            num_peers=len(ids),
            neighbours=res.present,
            missing_neighbours=res.missing,
            weights=res.weights,
            clipped=res.clipped,
            clip_radius=res.clip_radius,
            pull_ratio=res.pull_ratio,
            routed_around=around,
            rejected=dict(rejected),
            checkpoint_failures=self.checkpoint_failures,
            user=self.data.user,
            peer_id=me,
            seconds=round(time.time() - t0, 3),
            # as GRPO's round-0 row: which model this run started from (the preset's weights hash)
            model=self.loaded.info() if r == 0 else None,
        )
        self.last_stats = stats
        self.neighbours = res.present
        self.last_round = r
        log.debug("round %d: consensus %.4f neighbours %d missing %d", r, res.consensus_distance,
                  len(res.present), len(res.missing))
        return row


def run_dpo_node(cfg: NodeConfig, state_dir: Path, log_level: str = "info") -> int:
    """Run DPO rounds until cfg.rounds or a signal; one JSON line per round in state_dir/metrics.jsonl."""
    return run_node(lambda: DPONode(cfg, state_dir), log_level)
