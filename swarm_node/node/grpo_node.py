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
from swarm_node.evaluation import evaluate
from swarm_node.generation import make_generator
from swarm_node.generation.prompts import PromptEncoder
from swarm_node.models.loading import LoadedModel, enable_gradient_checkpointing, load_model
from swarm_node.node.checkpoint import (
    CheckpointWriteError,
    failed_save_line,
    model_record,
    restore_newest,
    save_checkpoint,
)
from swarm_node.node.logs import setup_logging
from swarm_node.node.metrics import MetricsWriter
from swarm_node.node.pipeline import PipelinedSampler
from swarm_node.node.progress import RoundProgress
from swarm_node.node.rollouts import (
    Expectations,
    LocalRollouts,
    LogprobAudit,
    NewcomerGate,
    ReplayWindow,
    SkewAudit,
    admit_batch,
    cap_share,
    score,
)
from swarm_node.node.stopping import StopFlag
from swarm_node.protocol import DecodeLimits, ProtocolError, decode_batch, encode_batch
from swarm_node.swarm.ratelimit import RateLimitedLog
from swarm_node.tasks import get_task
from swarm_node.tasks.base import Task
from swarm_node.training.groups import TrainGroup
from swarm_node.training.grpo_step import GRPOTrainer
from swarm_node.training.lr_schedule import lr_factor
from swarm_node.training.optim import set_lr

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
        if cfg.training.gradient_checkpointing:
            enable_gradient_checkpointing(self.loaded.model)
        self.tok = self.loaded.tokenizer
        self.prompts = PromptEncoder(self.tok, cfg.generation.chat_template, cfg.generation.max_prompt_tokens)
        self.task: Task = get_task(cfg.task)
        self.generator = make_generator(self.loaded, cfg.generation)
        self.trainer = GRPOTrainer(self.loaded.model, cfg.training, self.tok.pad_token_id,
                                   lr_default=self.loaded.default_lr(), temperature=cfg.generation.temperature)
        self.metrics = MetricsWriter.from_config(self.state_dir, cfg, node_name=self.loaded.name)
        self.round = 0
        self.saved_round = 0  # round 0 = the model as loaded; never worth a checkpoint
        self.checkpoint_failures = 0  # saves that failed (disk full...); the node keeps training
        self.swarm = None
        self.first_exchange = False
        self.limits = receive_limits(cfg)
        self.expect = Expectations(
            swarm_id=cfg.swarm.swarm_id, task_id=self.task.task_id, tokenizer_fp=self.loaded.tokenizer_fp,
            vocab_size=self.loaded.vocab_size, trust_peer_rewards=cfg.swarm.trust_peer_rewards,
        )
        # hole 5: a completion counts once, over as many rounds as the intake would accept a batch's age
        self.replay = ReplayWindow(window=cfg.swarm.staleness_rounds + 2, max_age_s=cfg.swarm.max_batch_age_s + 10)
        self.audit = LogprobAudit(cap=cfg.training.cap)  # hole 6: claimed log-probs against our recompute
        self.skew = SkewAudit()  # hole 6, targeted: lowered only on positive-advantage completions, per peer
        # Sybils: identities not yet established take at most a quarter of the K slots a round (at least 1)
        self.newcomers = NewcomerGate(max_new=max(1, cfg.swarm.max_peers_per_round // 4))
        self.peer_log = RateLimitedLog(log, burst=5, period_s=60.0)  # lines a peer can cause
        # groups from an in-process source instead of the swarm (off-policy experiments, benchmarks)
        self.external_source: Callable[[int], list[TrainGroup]] | None = None
        # pipeline: true -> round r+1 samples in the background (from the weights before round r's step)
        self.pipe = PipelinedSampler(self.loaded, cfg.generation, self.generator) if cfg.pipeline else None

    # ---- lifecycle ---------------------------------------------------------------------------------

    def resume(self) -> None:
        """Continue from the newest readable checkpoint (an unreadable one falls back to the one before)."""
        ck = restore_newest(self.state_dir, self.loaded.model, self.trainer, self.cfg.fingerprint())
        if ck is None:
            self.metrics.truncate_after(-1)  # nothing to resume: rows of an unsaved earlier run are void
            return
        self.round = self.saved_round = ck.round
        self.metrics.truncate_after(self.round)
        self.generator.sync_weights(self.loaded.model)  # built before the weights were restored
        log.info("resumed from %s: continuing at round %d", ck.path, self.round + 1)

    def checkpoint(self) -> bool:
        """Save the current round; False (logged in one line, counted) if the write failed, e.g. disk full.

        A failed save leaves the previous checkpoint in place and nothing half-written; the next due save
        tries again.
        """
        if self.saved_round == self.round:  # nothing new since the last save
            return True
        try:
            save_checkpoint(self.state_dir, self.round, self.loaded.model, self.trainer.state_dict(),
                            model_record(self.loaded, self.cfg.model.lora) | self.prompt_record(),
                            self.cfg.fingerprint(), keep=self.cfg.checkpoint.keep)
        except CheckpointWriteError as exc:
            self.checkpoint_failures += 1
            log.error("%s", failed_save_line(self.state_dir, self.round, exc))
            return False
        self.saved_round = self.round
        return True

    def prompt_record(self) -> dict:
        """How this node encodes prompts, so `swarm-node eval STATE_DIR` scores the model as it was trained."""
        g = self.cfg.generation
        return {"prompt_encoding": {"chat_template": g.chat_template, "max_prompt_tokens": g.max_prompt_tokens}}

    def join_swarm(self) -> None:
        from swarm_node.swarm import PeerInfo, SwarmNode

        info = PeerInfo(mode="grpo", model_name=self.loaded.name, tokenizer_fp=self.loaded.tokenizer_fp,
                        task_id=self.task.task_id)
        self.swarm = SwarmNode(self.cfg.swarm, info, logger=logging.getLogger("swarm_node.swarm"))
        self.swarm.set_accept(self._accepts_peer)  # before start: pushes and downloads only from usable peers
        self.swarm.set_validate(self._check_payload)  # decode + wire checks on the swarm's decode thread
        self.swarm.start()
        self.swarm.set_round(self.round)
        self.first_exchange = True
        log.info("peer id %s; reachable at %s", self.swarm.peer_id, " ".join(self.swarm.visible_maddrs()))

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
        if self.swarm is not None:
            self.swarm.close()
            self.swarm = None

    # ---- one round ---------------------------------------------------------------------------------

    def _rng(self, round_: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, self.cfg.task.seed, round_])

    def evaluate(self) -> dict:
        g = self.cfg.generation
        return evaluate(self.loaded.model, self.tok, self.task, self.cfg.task.eval_split, self.cfg.task.eval_n,
                        max_new_tokens=g.max_new_tokens, batch_size=max(g.batch_size, 64), encode=self.prompts.encode)

    def generate(self, round_: int) -> LocalRollouts:
        prompts, ids = self._round_prompts(round_)
        samples, _seconds = self._sample_job(ids, round_)(self.generator)
        return LocalRollouts(prompts, ids, samples, score(self.task, self.tok, prompts, samples))

    def _round_prompts(self, round_: int) -> tuple[list, list[list[int]]]:
        prompts = self.task.train_prompts(self.cfg.task.prompts_per_round, self._rng(round_))
        return prompts, [self.prompts.encode(p.text) for p in prompts]

    def _sample_job(self, ids: list[list[int]], round_: int) -> Callable:
        """Sampling alone (no tokenizer: safe in the pipeline's thread); the seed depends on the round only."""
        g = self.cfg.generation

        def job(generator) -> tuple[list, float]:
            t0 = time.perf_counter()
            samples = generator.generate(ids, g.num_generations, max_new_tokens=g.max_new_tokens,
                                         temperature=g.temperature, seed=self.cfg.seed * 1_000_003 + round_)
            return samples, time.perf_counter() - t0

        return job

    def _pipelined_generate(self, r: int) -> tuple[LocalRollouts, int, float, float]:
        """Round r's samples from the background generation started last round (or now, after a (re)start),
        then the next round's generation started from the current weights -> (rollouts, their policy
        version, generation start time, seconds of generation)."""
        pipe = self.pipe
        got = pipe.take(r)
        if got is None:  # first round of this process: nothing in flight yet, sample now from the current policy
            pipe.sync(self.loaded.model, self.round)
            prompts, ids = self._round_prompts(r)
            generated = time.time()
            samples, gen_s = self._sample_job(ids, r)(pipe.generator)
            version = self.round
        else:
            pending, (samples, gen_s) = got
            prompts, ids = pending.context
            version, generated = pending.version, pending.generated
        local = LocalRollouts(prompts, ids, samples, score(self.task, self.tok, prompts, samples))
        if self.cfg.rounds is None or r < self.cfg.rounds:  # round r+1 samples while round r trains
            pipe.sync(self.loaded.model, self.round)  # the weights before this round's step: version self.round
            nxt_prompts, nxt_ids = self._round_prompts(r + 1)
            pipe.start(r + 1, (nxt_prompts, nxt_ids), self._sample_job(nxt_ids, r + 1))
        return local, version, generated, gen_s

    def _check_payload(self, payload: bytes, round_: int) -> tuple[object, str | None, str]:
        """Decode a peer's batch and check it is the announced round -> (batch, None, "") or (None, reason, detail).

        Called by the swarm on its decode thread as each download completes (so a payload that is slow to
        decode never delays a round), and here for batches that arrive without it. Pure protocol code: no
        model, no tokenizer, so it is safe off the round loop.
        """
        try:
            decoded = decode_batch(payload, self.limits)
        except ProtocolError as exc:
            return None, f"protocol:{exc.reason}", str(exc)
        if decoded.round != round_:  # the payload must be what the announcement said
            return None, "round_mismatch", f"payload says round {decoded.round}, announced {round_}"
        return decoded, None, ""

    def _accepts_peer(self, m) -> bool:
        return m.mode == "grpo" and m.task_id == self.task.task_id and m.tokenizer_fp == self.loaded.tokenizer_fp

    def exchange(self, local: LocalRollouts, round_: int, *, version: int | None = None,
                 generated: float | None = None) -> tuple[list, dict]:
        """Publish our batch, take peers' batches; returns (external groups, per-round swarm stats).

        Async exchange (default): takes what has arrived since the last round, without waiting; nothing
        arrived -> this round trains on its own groups only (except the first round after joining, which
        waits once for the live peers' first batches). Lockstep: waits up to collect_deadline_s.
        """
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
        self.swarm.publish("batch", round_, payload, version=version, generated=generated)
        self.replay.remember(round_, local.train_groups())  # our own samples sent back to us count once
        info["bytes_per_token"] = len(payload) / max(1, local.tokens())
        # The first round after joining waits (up to the deadline) for the first batches of the live peers
        # it sees, so a swarm started together shares from its first round; after that, async never waits.
        first, self.first_exchange = self.first_exchange, False
        intake = self.swarm.receive(sw.max_peers_per_round, accept=self._accepts_peer,
                                    lockstep=sw.exchange == "lockstep" or first, round=round_,
                                    staleness=round_ if first else sw.staleness_rounds,
                                    deadline_s=sw.collect_deadline_s, choose=self.newcomers.choose)
        info["collect_s"] = intake.waited_s
        rejected: Counter = Counter({f"swarm:{r}": n for r, n in intake.rejected.items()})
        rejected.update(intake.payload_refused)  # refused on the decode thread (protocol:*, round_mismatch)
        info.update(bytes_out=len(payload), bytes_in=intake.payload_bytes_in,  # published / downloaded
                    payload_bytes_out=intake.payload_bytes_out, control_bytes_in=intake.control_bytes_in,
                    control_bytes_out=intake.control_bytes_out, buffer_events=intake.events)
        groups, ages, lags = [], [], []
        if self.newcomers.passed_over:  # Sybils: newcomers beyond this round's share stay in the buffer
            rejected["newcomer_capped"] += self.newcomers.passed_over
            self.newcomers.passed_over = 0
        self.newcomers.start_round(round_)
        for rec in sorted(intake.batches, key=lambda b: self.newcomers.rank(b.peer_id)):
            if not self.newcomers.admit(rec.peer_id):
                rejected["newcomer_capped"] += 1
                continue
            decoded = rec.decoded  # decoded and checked in the background as it arrived
            if decoded is None:
                decoded, reason, detail = self._check_payload(rec.payload, rec.round)
                if reason is not None:
                    rejected[reason] += 1
                    self.peer_log.warning(reason, "rejected batch from %s: %s", rec.peer_id, detail)
                    continue
            adm = admit_batch(decoded, rec.peer_id, self.task, self.tok, self.expect, encode=self.prompts.encode)
            rejected.update(adm.rejected)
            info["rewards_overridden"] += adm.rewards_changed
            if adm.rejected:
                self.peer_log.warning("declined", "declined %s from %s", dict(adm.rejected), rec.peer_id)
            adm.groups, dup = self.replay.admit(round_, adm.groups)
            rejected.update(dup)
            adm.groups, capped = cap_share(adm.groups, self.cfg.task.prompts_per_round)
            if capped:
                rejected["share_capped"] += capped
            if adm.groups:
                recomputed = self.trainer.completion_logprobs(adm.groups)
                ok, stat, limit = self.audit.judge(adm.groups, recomputed)
                if not ok:
                    rejected["logprob_outlier"] += 1
                    self.peer_log.warning("logprob_outlier", "declined batch from %s: mean capped weight %.3f > %.3f",
                                          rec.peer_id, stat, limit)
                    continue
                ok, gap, lower = self.skew.judge(rec.peer_id, adm.groups, recomputed)
                if not ok:
                    rejected["logprob_skew"] += 1
                    self.peer_log.warning("logprob_skew", "declined batch from %s: positive-advantage log-ratio gap "
                                          "%.3f (lower bound %.3f) > %.2f", rec.peer_id, gap, lower,
                                          self.skew.tolerance)
                    continue
                self.newcomers.passed(rec.peer_id, round_)
            groups.extend(adm.groups)
            if adm.groups:
                ages.append(rec.age_s)
                lags.append(rec.version_lag)
            name = rec.member.model_name if rec.member else ""
            key = f"{rec.peer_id[-8:]}:{name}" if name else rec.peer_id
            info["external_by_peer"][key] = info["external_by_peer"].get(key, 0) + len(adm.groups)
        info["peers_seen"] = len(intake.batches)
        info["batch_age_s"] = ages
        info["version_lag"] = lags
        info["rejected"] = dict(rejected)
        return groups, info

    def run_round(self) -> dict:
        r = self.round + 1
        t0 = time.perf_counter()
        # policy version = rounds trained so far (the policy that sampled round r has seen r - 1 rounds)
        if self.pipe is None:
            generated = time.time()
            local = self.generate(r)
            version = self.round
            gen_s = wait_s = time.perf_counter() - t0
        else:  # sampled in the background during the previous round's training: one version behind
            local, version, generated, gen_s = self._pipelined_generate(r)
            wait_s = time.perf_counter() - t0
        external, swarm_info = self.exchange(local, r, version=version, generated=generated)
        t1 = time.perf_counter()
        t = self.cfg.training
        lr_now = self.trainer.lr * lr_factor(t.lr_schedule, r - 1, t.warmup_rounds, self.cfg.rounds)
        set_lr(self.trainer.optimizer, lr_now)
        log.debug("round %d: training step on %d external groups", r, len(external))  # fault tests watch this
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
        if res.stepped and self.pipe is None:  # (pipelined: the sampler syncs between its generations)
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
            "mean_ratio_local": res.mean_ratio_local,  # != 1 when pipelined: own samples one version old
            "mean_ratio_external": res.mean_ratio_external,
            "truncated_frac_external": res.truncated_frac_external,
            "divergence_external": res.mean_divergence_external,
            "grad_norm": res.grad_norm,
            "lr": lr_now,
            "stepped": res.stepped,
            "tokens_per_s": local.tokens() / gen_s if gen_s > 0 else None,
            "gen_s": round(gen_s, 4),
            "gen_wait_s": round(wait_s, 4),  # round time spent waiting for its own samples (pipelined: < gen_s)
            "policy_version": version,  # the policy that sampled this round's own groups
            "local_version_lag": self.round - 1 - version,  # 1 when pipelined, else 0
            "train_s": round(train_s, 4),
            "collect_s": round(swarm_info["collect_s"], 4),
            "external_groups_by_peer": swarm_info["external_by_peer"],
            "rejected": swarm_info["rejected"],
            "rewards_overridden": swarm_info["rewards_overridden"],
            "checkpoint_failures": self.checkpoint_failures,
            "bytes_out": swarm_info["bytes_out"],
            "bytes_in": swarm_info["bytes_in"],
            "time": time.time(),
        }
        if "bytes_per_token" in swarm_info:
            row["bytes_per_token"] = round(swarm_info["bytes_per_token"], 3)
        if self.swarm is not None:  # the exchange's own costs this round (docs/architecture.md, "The exchange")
            ages, lags = swarm_info["batch_age_s"], swarm_info["version_lag"]
            row.update({
                "payload_bytes_out": swarm_info["payload_bytes_out"],
                "control_bytes_in": swarm_info["control_bytes_in"],
                "control_bytes_out": swarm_info["control_bytes_out"],
                "batch_age_s_mean": round(float(np.mean(ages)), 3) if ages else None,
                "batch_age_s_max": round(float(max(ages)), 3) if ages else None,
                "version_lag_mean": round(float(np.mean(lags)), 3) if lags else None,
                "version_lag_max": int(max(lags)) if lags else None,
                "buffer_evicted": swarm_info["buffer_events"].get("evicted", 0),
                "buffer_superseded": swarm_info["buffer_events"].get("superseded", 0),
            })
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
        if not node.checkpoint():
            log.error("exiting without a checkpoint of round %d (see above): a restart resumes from the one "
                      "named there", node.round)
            return 1
    finally:
        progress.close()
        node.close()
        node.metrics.close()
        stop.restore()
    return 0
