"""The GRPO round: sample -> reward -> publish -> receive -> admit -> F-TIS step -> eval -> metrics row.

`GRPONode.run_round` is one round; the daemon around it (resume, join, checkpoints, stop, progress) is the
loop both modes share (node/loop.py), started by `run_grpo_node`. Each part lives in its own module
(generation, tasks, protocol, swarm, training; grpo.admission for what of the peers' batches is trained
on, node.rows for the metrics row). With the swarm disabled the same round trains alone on-policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from swarm_node.config import NodeConfig
from swarm_node.evaluation import eval_metrics, evaluate
from swarm_node.generation import make_generator
from swarm_node.generation.prompts import PromptEncoder, chat_template_setting
from swarm_node.grpo.admission import Admission, payload_check
from swarm_node.grpo.limits import receive_limits
from swarm_node.grpo.pipeline import PipelinedSampler
from swarm_node.grpo.rollouts import Expectations, LocalRollouts, score
from swarm_node.models.loading import LoadedModel, decoder_layers, load_model
from swarm_node.node.checkpoint import model_record
from swarm_node.node.loop import RoundNode, run_node
from swarm_node.node.metrics import MetricsWriter
from swarm_node.node.reasons import Rejections, from_swarm
from swarm_node.node.rows import GRPORow, SwarmCosts
from swarm_node.node.stopping import StopFlag
from swarm_node.node.timing import RoundClock
from swarm_node.planning import check_fits
from swarm_node.planning.memory import engine_sleeps
from swarm_node.protocol import encode_batch
from swarm_node.tasks import get_task
from swarm_node.tasks.base import Task
from swarm_node.training.ftis_step import FTISTrainer
from swarm_node.training.groups import TrainGroup

log = logging.getLogger("swarm_node.node")


@dataclass
class ExchangeResult:
    """What one round's exchange brought in (groups to train on) and what it cost."""

    groups: list[TrainGroup] = field(default_factory=list)
    rejected: Rejections = field(default_factory=Rejections)  # everything refused since the last round, by reason
    groups_by_peer: dict[str, int] = field(default_factory=dict)
    rewards_overridden: int = 0
    collect_s: float = 0.0
    bytes_out: int = 0  # payload published
    bytes_in: int = 0  # payloads downloaded
    bytes_per_token: float | None = None
    swarm: SwarmCosts | None = None  # None: no swarm (alone, or an in-process source)


class GRPONode(RoundNode):
    """State of one GRPO node between rounds (`last_round`: node/loop.py)."""

    MODE = "GRPO"
    FIRST_ROUND = 1  # round 0 is the evaluation of the model as loaded

    def __init__(self, cfg: NodeConfig, state_dir: Path, loaded: LoadedModel | None = None):
        super().__init__(cfg, state_dir)
        # before a weight is loaded: a config that cannot fit the device is refused in one line
        self.plan = check_fits(cfg) if loaded is None else None
        self.loaded = loaded or load_model(cfg.model.path, dtype=cfg.model.dtype, device=cfg.model.device,
                                           lora=cfg.model.lora, name=cfg.model.name)
        self.tok = self.loaded.tokenizer
        self.prompts = PromptEncoder(self.tok, chat_template_setting(cfg.generation.chat_template, cfg.task.prompt_form),
                                     cfg.generation.max_prompt_tokens)
        self.task: Task = get_task(cfg.task)
        self.generator = make_generator(self.loaded, cfg.generation, sleep=engine_sleeps(cfg),
                                        engine_share=self.plan.engine_share() if self.plan and self.plan.engine else None)
        self.trainer = FTISTrainer(self.loaded.model, cfg.training, self.tok.pad_token_id,
                                   lr_default=self.loaded.default_lr(), temperature=cfg.generation.temperature,
                                   checkpoint_layers=decoder_layers(self.loaded.model)
                                   if cfg.training.gradient_checkpointing else (),
                                   compute_dtype=self.loaded.dtype)
        self.metrics = MetricsWriter.from_config(self.state_dir, cfg, node_name=self.loaded.name)
        self._start_rounds()
        self.swarm = None
        self.first_exchange = False
        self.limits = receive_limits(cfg)
        self.admission = Admission(
            cfg, self.task, self.tok,
            Expectations(swarm_id=cfg.swarm.swarm_id, task_id=self.task.task_id,
                         tokenizer_fp=self.loaded.tokenizer_fp, vocab_size=self.loaded.vocab_size,
                         trust_peer_rewards=cfg.swarm.trust_peer_rewards),
            recompute=self.trainer.completion_logprobs, encode=self.prompts.encode, log=log)
        # groups from an in-process source instead of the swarm (off-policy experiments, benchmarks)
        self.external_source: Callable[[int], list[TrainGroup]] | None = None
        # pipeline: true -> round r+1 samples in the background (from the weights before round r's step)
        self.pipe = PipelinedSampler(self.loaded, cfg.generation, self.generator) if cfg.pipeline else None
        self.clock = RoundClock()  # the round's time split (sample, score, exchange, train, eval) for metrics

    # ---- lifecycle (the loop itself: node/loop.py) ---------------------------------------------------

    def after_resume(self) -> None:
        self.generator.sync_weights(self.loaded.model)  # built before the weights were restored

    def checkpoint_record(self) -> dict:
        return model_record(self.loaded, self.cfg.model.lora) | self.prompt_record()

    def prompt_record(self) -> dict:
        """How this node encodes prompts, so `swarm-node eval STATE_DIR` scores the model as it was trained."""
        g = self.cfg.generation
        t = self.cfg.task
        return {"prompt_encoding": {"chat_template": chat_template_setting(g.chat_template, t.prompt_form),
                                    "max_prompt_tokens": g.max_prompt_tokens, "prompt_form": t.prompt_form,
                                    "max_operand": t.max_operand}}

    def join(self, stop: StopFlag) -> None:
        sw = self.cfg.swarm
        if not sw.enabled:
            return
        self.join_swarm()
        if sw.wait_for_peers > 0:
            live = self.swarm.wait_for_peers(sw.wait_for_peers, sw.join_wait_s, lambda: bool(stop))
            log.info("%d other peer(s) live (wait_for_peers %d, join_wait_s %.0f)", live, sw.wait_for_peers,
                     sw.join_wait_s)

    def join_swarm(self) -> None:
        from swarm_node.swarm import PeerInfo, SwarmPeer

        info = PeerInfo(mode="grpo", model_name=self.loaded.name, tokenizer_fp=self.loaded.tokenizer_fp,
                        task_id=self.task.task_id)
        # decode + wire checks on the swarm's decode thread; pushes and downloads only from usable peers
        self.swarm = SwarmPeer(self.cfg.swarm, info, validate=payload_check(self.limits),
                               accept=self.admission.accepts_peer, batch_cap=self.limits.max_compressed_bytes,
                               rank=self.admission.download_rank,
                               logger=logging.getLogger("swarm_node.swarm"))
        self.swarm.start()
        self.swarm.set_round(self.last_round)
        self.first_exchange = True
        log.info("peer id %s; reachable at %s", self.swarm.peer_id, " ".join(self.swarm.visible_maddrs()))

    def start(self) -> None:
        """Round 0: the held-out accuracy of the model as loaded."""
        ev = self.evaluate()
        self.metrics.write(GRPORow.initial(eval_metrics(ev), self.loaded.info(), self.task.task_id, self.task.mix))
        log.info("round 0: eval accuracy %.3f (%s split, n=%d)", ev["accuracy"], self.cfg.task.eval_split, ev["n"])

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
        self.generator.close()  # a vLLM engine's memory and process-wide state go back now, not at exit
        if self.swarm is not None:
            self.swarm.close()
            self.swarm = None
        self.metrics.close()

    # ---- one round ---------------------------------------------------------------------------------

    def _rng(self, round_: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, self.cfg.task.seed, round_])

    def evaluate(self) -> dict:
        """Greedy held-out accuracy; a vLLM node decodes through its own engine (not while a pipelined
        generation may be using it)."""
        g = self.cfg.generation
        engine = self.generator if g.backend == "vllm" and self.pipe is None else None
        return evaluate(self.loaded.model, self.tok, self.task, self.cfg.task.eval_split, self.cfg.task.eval_n,
                        max_new_tokens=g.max_new_tokens, batch_size=max(g.batch_size, 64), encode=self.prompts.encode,
                        generator=engine)

    def generate(self, round_: int) -> LocalRollouts:
        prompts, ids = self._round_prompts(round_)
        samples, _seconds = self._sample_job(ids, round_)(self.generator)
        return LocalRollouts(prompts, ids, samples, self._score(prompts, samples))

    def _score(self, prompts: list, samples: list) -> list:
        with self.clock.phase("score"):  # decoding and rewarding: a real task's answer parsing shows here
            return score(self.task, self.tok, prompts, samples)

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
            pipe.sync(self.loaded.model, self.last_round)
            prompts, ids = self._round_prompts(r)
            generated = time.time()
            samples, gen_s = self._sample_job(ids, r)(pipe.generator)
            version = self.last_round
        else:
            pending, (samples, gen_s) = got
            prompts, ids = pending.context
            version, generated = pending.version, pending.generated
        local = LocalRollouts(prompts, ids, samples, self._score(prompts, samples))
        if self.cfg.rounds is None or r < self.cfg.rounds:  # round r+1 samples while round r trains
            pipe.sync(self.loaded.model, self.last_round)  # the weights before this round's step: version last_round
            nxt_prompts, nxt_ids = self._round_prompts(r + 1)
            pipe.start(r + 1, (nxt_prompts, nxt_ids), self._sample_job(nxt_ids, r + 1))
        return local, version, generated, gen_s

    def exchange(self, local: LocalRollouts, round_: int, *, version: int | None = None,
                 generated: float | None = None) -> ExchangeResult:
        """Publish our batch, receive what peers sent, admit what of it we train on.

        Async exchange (default): takes what has arrived since the last round, without waiting; nothing
        arrived -> this round trains on its own groups only (except the first round after joining, which
        waits once for live peers and their first batches). Lockstep: waits up to collect_deadline_s.
        """
        if self.swarm is None:
            if self.external_source is None:
                return ExchangeResult()
            groups = self.external_source(round_)
            return ExchangeResult(groups=groups, groups_by_peer={"in-process": len(groups)})
        sw = self.cfg.swarm
        # publish
        batch = local.to_batch(swarm_id=sw.swarm_id, task_id=self.task.task_id,
                               tokenizer_fp=self.loaded.tokenizer_fp, model_name=self.loaded.name,
                               round_=round_, vocab_size=self.loaded.vocab_size)
        payload = encode_batch(batch)
        self.swarm.set_round(round_)
        self.swarm.publish("batch", round_, payload, version=version, generated=generated)
        self.admission.remember_own(round_, local.train_groups())  # our own samples sent back to us count once
        # receive: the first round after joining waits (up to the deadline) for live peers to show up and for
        # their first batches, so a swarm started together shares from its first round however fast each peer
        # starts; after that, async never waits
        first, self.first_exchange = self.first_exchange, False
        intake = self.swarm.receive(sw.max_peers_per_round, accept=self.admission.accepts_peer,
                                    lockstep=sw.exchange == "lockstep" or first, round=round_,
                                    staleness=round_ if first else sw.staleness_rounds,
                                    deadline_s=sw.collect_deadline_s, choose=self.admission.choose,
                                    joining=first)
        # admit
        admitted = self.admission.admit(intake.batches, round_)
        rejected = from_swarm(intake.rejected, intake.payload_refused)  # swarm:*, and the decode thread's protocol:*, round_mismatch
        rejected.update(admitted.rejected)
        return ExchangeResult(
            groups=admitted.groups, rejected=rejected, groups_by_peer=admitted.groups_by_peer,
            rewards_overridden=admitted.rewards_overridden, collect_s=intake.waited_s,
            bytes_out=len(payload), bytes_in=intake.payload_bytes_in,
            bytes_per_token=len(payload) / max(1, local.tokens()),
            swarm=SwarmCosts.of(admitted.batch_ages_s, admitted.version_lags, intake.events,
                                payload_bytes_out=intake.payload_bytes_out, control_bytes_in=intake.control_bytes_in,
                                control_bytes_out=intake.control_bytes_out),
        )

    def run_round(self, evaluate: Callable[[], bool] | None = None) -> GRPORow:
        r = self.last_round + 1
        self.clock.start()
        t0 = time.perf_counter()
        # policy version = rounds trained so far (the policy that sampled round r has seen r - 1 rounds)
        if self.pipe is None:
            generated = time.time()
            local = self.generate(r)
            version = self.last_round
            gen_s = wait_s = time.perf_counter() - t0
        else:  # sampled in the background during the previous round's training: one version behind
            local, version, generated, gen_s = self._pipelined_generate(r)
            wait_s = time.perf_counter() - t0
        # own sampling as the round saw it: its wait (pipelined: only what the last step did not cover)
        self.clock.add("sample", max(0.0, wait_s - self.clock.seconds.get("score", 0.0)))
        with self.clock.phase("exchange"):
            ex = self.exchange(local, r, version=version, generated=generated)
        external = ex.groups
        t1 = time.perf_counter()
        lr_now = self.apply_lr_schedule()
        log.debug("round %d: training step on %d external groups", r, len(external))  # fault tests watch this
        if self.pipe is None:
            self.generator.release()  # vLLM on a GPU sleeps: the step has the card
        try:
            res = self.trainer.step(local.train_groups() + external)
        except torch.OutOfMemoryError:
            # even one sequence per micro-batch did not fit (the trainer halves its token budget first):
            # peers' completions may be longer than ours, so retry the round on our own samples only
            log.warning("out of memory training on %d external groups; retrying with local groups only",
                        len(external))
            self.trainer.optimizer.zero_grad(set_to_none=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            ex.rejected["oom_external"] = len(external)
            res = self.trainer.step(local.train_groups())
        if self.pipe is None:  # (pipelined: the sampler syncs between its generations)
            self.generator.resume(self.loaded.model, changed=res.stepped)
        train_s = time.perf_counter() - t1
        self.clock.add("train", train_s)
        self.last_round = r
        row = GRPORow(
            round=r,
            reward_mean=local.reward_mean(),
            loss=res.loss if res.stepped else None,
            local_groups=res.groups_local,
            external_groups=res.groups_external,
            filtered=res.seqs_filtered,
            filtered_external=res.seqs_filtered_external,
            kept=res.seqs_kept,
            zero_advantage_groups=res.groups_zero_advantage,
            mean_ratio_local=res.mean_ratio_local,
            mean_ratio_external=res.mean_ratio_external,
            truncated_frac_external=res.truncated_frac_external,
            divergence_external=res.mean_divergence_external,
            grad_norm=res.grad_norm,
            lr=lr_now,
            stepped=res.stepped,
            tokens_per_s=local.tokens() / gen_s if gen_s > 0 else None,
            gen_s=round(gen_s, 4),
            gen_wait_s=round(wait_s, 4),
            policy_version=version,
            local_version_lag=r - 1 - version,
            train_s=round(train_s, 4),
            collect_s=round(ex.collect_s, 4),
            external_groups_by_peer=ex.groups_by_peer,
            rejected=dict(ex.rejected),
            rewards_overridden=ex.rewards_overridden,
            checkpoint_failures=self.checkpoint_failures,
            bytes_out=ex.bytes_out,
            bytes_in=ex.bytes_in,
            bytes_per_token=round(ex.bytes_per_token, 3) if ex.bytes_per_token is not None else None,
            swarm=ex.swarm,
        )
        if res.oom_retries or self.trainer.token_budget != self.cfg.training.micro_batch_tokens:
            row.oom_retries, row.micro_batch_tokens = res.oom_retries, self.trainer.token_budget
        engine_s = getattr(self.generator, "seconds", None)
        if engine_s:
            row.engine_s = {k: round(v, 4) for k, v in engine_s.items()}
        if evaluate() if evaluate is not None else self.eval_due(r):
            with self.clock.phase("eval"):
                ev = self.evaluate()
            row.with_eval(eval_metrics(ev))
        row.time_split_s = self.clock.split()
        return row


def run_grpo_node(cfg: NodeConfig, state_dir: Path, log_level: str = "info") -> int:
    """Run until cfg.rounds rounds are done or SIGINT/SIGTERM; checkpoint and leave cleanly; exit code."""

    return run_node(lambda: GRPONode(cfg, state_dir), log_level)
