"""The GRPO round loop: sample -> reward -> publish -> collect -> F-TIS step -> eval -> checkpoint -> metrics.

One function, `run_grpo_node`, wires the parts together; each part lives in its own module (generation,
tasks, protocol, swarm, training, node.checkpoint, node.metrics, node.rollouts). With the swarm disabled
the same loop trains alone on-policy.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from swarm_node.config import NodeConfig
from swarm_node.errors import UserFacingError
from swarm_node.evaluation import evaluate
from swarm_node.generation import make_generator
from swarm_node.models.loading import LoadedModel, load_model
from swarm_node.node.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    model_record,
    remove_partial,
    save_checkpoint,
)
from swarm_node.node.logs import setup_logging
from swarm_node.node.metrics import MetricsWriter
from swarm_node.node.progress import RoundProgress
from swarm_node.node.rollouts import Expectations, LocalRollouts, admit_batch, score
from swarm_node.node.stopping import StopFlag
from swarm_node.protocol import DecodeLimits, ProtocolError, decode_batch, encode_batch
from swarm_node.tasks import get_task
from swarm_node.tasks.base import Task
from swarm_node.training.groups import TrainGroup
from swarm_node.training.grpo_step import GRPOTrainer

log = logging.getLogger("swarm_node.node")


def receive_limits(cfg: NodeConfig) -> DecodeLimits:
    """Bounds on a peer's batch, sized from our own round so one batch cannot cost more than ~4 of ours.

    A peer's completions may be longer than ours (other settings, other models) but a batch whose decode
    or training forward would dwarf our own round is refused before it is decoded or trained on.
    """
    g = cfg.generation
    per_completion = 4 * g.max_new_tokens
    completions = 4 * cfg.task.prompts_per_round * g.num_generations
    return DecodeLimits(
        max_compressed_bytes=cfg.swarm.max_batch_bytes,
        max_groups=4 * cfg.task.prompts_per_round,
        max_completions_per_group=4 * g.num_generations,
        max_completions=completions,
        max_prompt_tokens=8192,
        max_tokens_per_completion=per_completion,
        max_total_tokens=completions * per_completion + 4 * cfg.task.prompts_per_round * 512,  # + prompts
    )


class GRPONode:
    """State of one GRPO node between rounds."""

    def __init__(self, cfg: NodeConfig, state_dir: Path, loaded: LoadedModel | None = None):
        self.cfg = cfg
        self.state_dir = Path(state_dir)
        self.loaded = loaded or load_model(cfg.model.path, dtype=cfg.model.dtype, device=cfg.model.device,
                                           lora=cfg.model.lora, name=cfg.model.name)
        self.tok = self.loaded.tokenizer
        self.task: Task = get_task(cfg.task)
        self.generator = make_generator(self.loaded, cfg.generation)
        self.trainer = GRPOTrainer(self.loaded.model, cfg.training, self.tok.pad_token_id,
                                   lr_default=self.loaded.default_lr())
        self.metrics = MetricsWriter(self.state_dir, cfg.metrics.prometheus_port)
        self.round = 0
        self.saved_round = 0  # round 0 = the model as loaded; never worth a checkpoint
        self.swarm = None
        self.limits = receive_limits(cfg)
        self.expect = Expectations(
            swarm_id=cfg.swarm.swarm_id, task_id=self.task.task_id, tokenizer_fp=self.loaded.tokenizer_fp,
            vocab_size=self.loaded.vocab_size, trust_peer_rewards=cfg.swarm.trust_peer_rewards,
        )
        self.rejected_total: Counter = Counter()
        # groups from an in-process source instead of the swarm (off-policy experiments, benchmarks)
        self.external_source: Callable[[int], list[TrainGroup]] | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------

    def resume(self) -> None:
        """Continue from the newest readable checkpoint (an unreadable one falls back to the one before)."""
        remove_partial(self.state_dir)
        for ck in reversed(list_checkpoints(self.state_dir)):
            try:
                opt_state, meta = load_checkpoint(ck, self.loaded.model, self.cfg.fingerprint())
                self.trainer.load_state_dict(opt_state)
            except UserFacingError:
                raise
            except Exception as exc:  # truncated file after a crash or power loss
                log.warning("checkpoint %s is unreadable (%s); trying the one before", ck.path, exc)
                continue
            self.round = int(meta["round"])
            self.saved_round = self.round
            self.metrics.truncate_after(self.round)
            self.generator.sync_weights(self.loaded.model)  # built before the weights were restored
            log.info("resumed from %s: continuing at round %d", ck.path, self.round + 1)
            return
        self.metrics.truncate_after(-1)  # nothing to resume: rows of an unsaved earlier run are void

    def checkpoint(self) -> None:
        if self.saved_round == self.round:  # nothing new since the last save
            return
        self.saved_round = self.round
        save_checkpoint(self.state_dir, self.round, self.loaded.model, self.trainer.state_dict(),
                        model_record(self.loaded, self.cfg.model.lora),
                        self.cfg.fingerprint(), keep=self.cfg.checkpoint.keep)

    def join_swarm(self) -> None:
        from swarm_node.swarm import PeerInfo, SwarmNode

        info = PeerInfo(mode="grpo", model_name=self.loaded.name, tokenizer_fp=self.loaded.tokenizer_fp,
                        task_id=self.task.task_id)
        self.swarm = SwarmNode(self.cfg.swarm, info, logger=logging.getLogger("swarm_node.swarm")).start()
        self.swarm.set_round(self.round)
        log.info("peer id %s; reachable at %s", self.swarm.peer_id, " ".join(self.swarm.visible_maddrs()))

    def close(self) -> None:
        if self.swarm is not None:
            self.swarm.close()
            self.swarm = None

    # ---- one round ---------------------------------------------------------------------------------

    def _rng(self, round_: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, self.cfg.task.seed, round_])

    def evaluate(self) -> dict:
        g = self.cfg.generation
        return evaluate(self.loaded.model, self.tok, self.task, self.cfg.task.eval_split, self.cfg.task.eval_n,
                        max_new_tokens=g.max_new_tokens, batch_size=max(g.batch_size, 64))

    def generate(self, round_: int) -> LocalRollouts:
        g = self.cfg.generation
        prompts = self.task.train_prompts(self.cfg.task.prompts_per_round, self._rng(round_))
        ids = [self.tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
        samples = self.generator.generate(ids, g.num_generations, max_new_tokens=g.max_new_tokens,
                                          temperature=g.temperature, seed=self.cfg.seed * 1_000_003 + round_)
        return LocalRollouts(prompts, ids, samples, score(self.task, self.tok, prompts, samples))

    def exchange(self, local: LocalRollouts, round_: int) -> tuple[list, dict]:
        """Publish our batch, collect peers' batches; returns (external groups, per-round swarm stats)."""
        info: dict = {"external_by_peer": {}, "rejected": {}, "rewards_overridden": 0, "bytes_out": 0,
                      "bytes_in": 0, "peers_seen": 0, "collect_s": 0.0}
        if self.swarm is None:
            if self.external_source is not None:
                groups = self.external_source(round_)
                info["external_by_peer"] = {"in-process": len(groups)}
                return groups, info
            return [], info
        sw = self.cfg.swarm
        batch = local.to_batch(swarm_id=sw.swarm_id, task_id=self.task.task_id,
                               tokenizer_fp=self.loaded.tokenizer_fp, model_name=self.loaded.name,
                               round_=round_, vocab_size=self.loaded.vocab_size)
        payload = encode_batch(batch)
        self.swarm.set_round(round_)
        self.swarm.publish("batch", round_, payload)
        info["bytes_out"] = len(payload)
        info["bytes_per_token"] = len(payload) / max(1, local.tokens())
        t0 = time.perf_counter()

        def accept(m) -> bool:
            return m.mode == "grpo" and m.task_id == self.task.task_id and m.tokenizer_fp == self.loaded.tokenizer_fp

        swarm_rejected_before = dict(self.swarm.stats().get("rejected", {}))
        received = self.swarm.collect("batch", round_, k=sw.max_peers_per_round, staleness=sw.staleness_rounds,
                                      deadline_s=sw.collect_deadline_s, accept=accept)
        info["collect_s"] = time.perf_counter() - t0
        rejected: Counter = Counter()
        for reason, n in self.swarm.stats().get("rejected", {}).items():  # transport-level: timeouts, digests...
            if n > swarm_rejected_before.get(reason, 0):
                rejected[f"swarm:{reason}"] += n - swarm_rejected_before.get(reason, 0)
        groups = []
        for rec in received:
            info["bytes_in"] += len(rec.payload)
            try:
                decoded = decode_batch(rec.payload, self.limits)
            except ProtocolError as exc:
                rejected[f"protocol:{exc.reason}"] += 1
                log.warning("rejected batch from %s: %s", rec.peer_id, exc)
                continue
            if decoded.round != rec.round:  # the payload must be what the signed announcement said
                rejected["round_mismatch"] += 1
                continue
            if decoded.round < round_ - sw.staleness_rounds:
                rejected["stale"] += 1
                continue
            adm = admit_batch(decoded, rec.peer_id, self.task, self.tok, self.expect)
            rejected.update(adm.rejected)
            info["rewards_overridden"] += adm.rewards_changed
            if adm.rejected:
                log.warning("declined %s from %s", dict(adm.rejected), rec.peer_id)
            groups.extend(adm.groups)
            name = rec.member.model_name if rec.member else ""
            key = f"{rec.peer_id[-8:]}:{name}" if name else rec.peer_id
            info["external_by_peer"][key] = info["external_by_peer"].get(key, 0) + len(adm.groups)
        info["peers_seen"] = len(received)
        info["rejected"] = dict(rejected)
        self.rejected_total.update(rejected)
        return groups, info

    def run_round(self) -> dict:
        r = self.round + 1
        t0 = time.perf_counter()
        local = self.generate(r)
        gen_s = time.perf_counter() - t0
        external, swarm_info = self.exchange(local, r)
        t1 = time.perf_counter()
        try:
            res = self.trainer.step(local.train_groups() + external)
        except torch.OutOfMemoryError:
            # peers' completions may be longer than ours: retry the round on our own samples only
            log.warning("out of memory training on %d external groups; retrying with local groups only",
                        len(external))
            self.trainer.optimizer.zero_grad(set_to_none=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            swarm_info["rejected"]["oom_external"] = len(external)
            res = self.trainer.step(local.train_groups())
        if res.stepped:
            self.generator.sync_weights(self.loaded.model)
        train_s = time.perf_counter() - t1
        self.round = r
        row = {
            "round": r,
            "reward_mean": local.reward_mean(),
            "loss": res.loss if res.stepped else None,
            "local_groups": res.groups_local,
            "external_groups": res.groups_external,
            "filtered": res.seqs_filtered,
            "filtered_external": res.seqs_filtered_external,
            "kept": res.seqs_kept,
            "zero_advantage_groups": res.groups_zero_advantage,
            "mean_ratio_external": res.mean_ratio_external,
            "truncated_frac_external": res.truncated_frac_external,
            "divergence_external": res.mean_divergence_external,
            "grad_norm": res.grad_norm,
            "lr": res.lr,
            "stepped": res.stepped,
            "tokens_per_s": local.tokens() / gen_s if gen_s > 0 else None,
            "gen_s": round(gen_s, 4),
            "train_s": round(train_s, 4),
            "collect_s": round(swarm_info["collect_s"], 4),
            "external_groups_by_peer": swarm_info["external_by_peer"],
            "rejected": swarm_info["rejected"],
            "rewards_overridden": swarm_info["rewards_overridden"],
            "bytes_out": swarm_info["bytes_out"],
            "bytes_in": swarm_info["bytes_in"],
            "time": time.time(),
        }
        if "bytes_per_token" in swarm_info:
            row["bytes_per_token"] = round(swarm_info["bytes_per_token"], 3)
        if self.cfg.rounds and r >= self.cfg.rounds or r % self.cfg.metrics.eval_every == 0:
            ev = self.evaluate()
            row["eval_accuracy"] = ev["accuracy"]
            row["eval_n"] = ev["n"]
        else:
            row["eval_accuracy"] = None
        return row


def run_grpo_node(cfg: NodeConfig, state_dir: Path, log_level: str = "info") -> int:
    """Run until cfg.rounds rounds are done or SIGINT/SIGTERM; checkpoint and leave cleanly; exit code."""
    setup_logging(log_level)
    torch.manual_seed(cfg.seed)
    stop = StopFlag()
    stop.install()
    node = GRPONode(cfg, state_dir)
    node.resume()
    progress = RoundProgress(name=node.loaded.name, total=cfg.rounds)
    try:
        if cfg.swarm.enabled and not stop:
            node.join_swarm()
        if node.round == 0 and not stop:
            ev = node.evaluate()
            node.metrics.write({"round": 0, "reward_mean": None, "loss": None, "local_groups": 0,
                                "external_groups": 0, "filtered": 0, "tokens_per_s": None, "gen_s": 0.0,
                                "train_s": 0.0, "eval_accuracy": ev["accuracy"], "eval_n": ev["n"],
                                "model": node.loaded.info(), "task_id": node.task.task_id, "time": time.time()})
            log.info("round 0: eval accuracy %.3f (%s split, n=%d)", ev["accuracy"], cfg.task.eval_split, ev["n"])
        while not stop and (cfg.rounds is None or node.round < cfg.rounds):
            row = node.run_round()
            node.metrics.write(row)
            progress.update(row)
            if node.round % cfg.checkpoint.every_rounds == 0:
                node.checkpoint()
        if stop:
            log.info("%s received: stopping after round %d", stop.signal_name, node.round)
        node.checkpoint()
    finally:
        progress.close()
        node.close()
        stop.restore()
    return 0
