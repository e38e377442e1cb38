"""The round loop of a node daemon, shared by GRPO and DPO: resume, join, rounds, checkpoints, stop, leave.

`RoundNode` holds what both modes keep between rounds (the round counter, checkpoint bookkeeping, the
metrics writer) and does what they do alike (resume from the newest readable checkpoint, save one);
`run_node` is the daemon: logging, the stop flag (SIGINT/SIGTERM finish the round, checkpoint, leave),
one progress line per round, the checkpoint cadence, and the exit code.

Round numbers (one convention for both modes): `last_round` is the number of the last finished round, the
number its metrics row, its checkpoint (`ckpt-<last_round>`) and the log lines carry; the next round is
`last_round + 1`. The modes differ only in where numbering starts (`FIRST_ROUND`): a GRPO run's round 0
is the evaluation of the model as loaded and its first trained round is 1; a DPO run trains from round 0,
the number its gossip rounds are matched by. `rounds_done` counts trained rounds in both, and
`rounds: N` in the config means N trained rounds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from swarm_node.node.checkpoint import CheckpointWriteError, failed_save_line, restore_newest, save_checkpoint
from swarm_node.node.logs import setup_logging
from swarm_node.node.metrics import MetricsWriter
from swarm_node.node.progress import RoundProgress
from swarm_node.node.rows import RoundRow
from swarm_node.node.stopping import StopFlag
from swarm_node.training.lr_schedule import lr_factor
from swarm_node.training.optim import set_lr

log = logging.getLogger("swarm_node.node")


class RoundNode:
    """What the loop needs of a node; GRPONode and DPONode are the two kinds.

    A subclass calls `__init__` first (the config, the state dir, the torch seed), then sets `loaded` (the
    model), `trainer` (with `lr`, `optimizer`, `state_dict` and `load_state_dict`) and `metrics`, calls
    `_start_rounds()`, and implements `run_round`, which sets its learning rate with `apply_lr_schedule`.
    """

    MODE: ClassVar[str] = ""
    FIRST_ROUND: ClassVar[int] = 1
    # Evaluate the round in which a stop was asked for, so the last row carries a held-out score. DPO:
    # yes (a few forward passes). GRPO: no, its eval generates eval_n completions, which could outlast a
    # supervisor's stop grace period (docker's 10 s); its last evaluated round is the last eval_every one.
    EVALUATES_ON_STOP: ClassVar[bool] = False

    cfg: Any
    state_dir: Path
    loaded: Any
    trainer: Any
    metrics: MetricsWriter

    def __init__(self, cfg: Any, state_dir: Path) -> None:
        """The one place both modes seed torch (parameter init of a LoRA adapter, dropout), before any model
        is built."""
        self.cfg = cfg
        self.state_dir = Path(state_dir)
        torch.manual_seed(cfg.seed)

    def _start_rounds(self) -> None:
        self.last_round = self.FIRST_ROUND - 1  # nothing trained yet
        self.saved_round = self.last_round  # the last round in a checkpoint (the model as loaded: never saved)
        self.checkpoint_failures = 0  # saves that failed (disk full...); the node keeps training

    @property
    def rounds_done(self) -> int:
        return self.last_round - self.FIRST_ROUND + 1

    def finished(self) -> bool:
        return self.cfg.rounds is not None and self.rounds_done >= self.cfg.rounds

    def round_lr(self) -> float:
        """The learning rate of round `last_round + 1`: the trainer's base lr times training.lr_schedule's factor
        at the round's 0-based place among trained rounds (`rounds_done`), so GRPO (rounds from 1) and DPO
        (from 0) follow one curve over their `rounds`."""
        t = self.cfg.training
        return self.trainer.lr * lr_factor(t.lr_schedule, self.rounds_done, t.warmup_rounds, self.cfg.rounds)

    def apply_lr_schedule(self) -> float:
        """Set `round_lr()` on the optimizer (both modes, before the round's training) and return it."""
        lr = self.round_lr()
        set_lr(self.trainer.optimizer, lr)
        return lr

    def eval_due(self, round_: int) -> bool:
        """Every `metrics.eval_every` rounds, and the run's last round."""
        last = self.FIRST_ROUND + self.cfg.rounds - 1 if self.cfg.rounds else None
        return (last is not None and round_ >= last) or round_ % self.cfg.metrics.eval_every == 0

    # ---- lifecycle ---------------------------------------------------------------------------------

    def resume(self) -> None:
        """Continue after the newest readable checkpoint (an unreadable one falls back to the one before)."""
        ck = restore_newest(self.state_dir, self.loaded.model, self.trainer, self.cfg.fingerprint())
        if ck is None:
            self.metrics.truncate_after(-1)  # nothing to resume: rows of an unsaved earlier run are void
            return
        self.last_round = self.saved_round = ck.round
        self.metrics.truncate_after(ck.round)
        self.after_resume()
        log.info("resumed from %s: continuing at round %d", ck.path, self.last_round + 1)

    def after_resume(self) -> None:
        """Hook: what must follow the restored weights (a generator holding its own copy)."""

    def checkpoint_record(self) -> dict:
        """What meta.json records beside the round (the model, so `export` and `eval` can rebuild it)."""
        return {}

    def checkpoint(self) -> bool:
        """Save the last finished round; False (logged in one line, counted) if the write failed, e.g. disk full.

        A failed save leaves the previous checkpoint in place and nothing half-written; the next due save
        tries again.
        """
        if self.last_round == self.saved_round:  # nothing new since the last save
            return True
        try:
            save_checkpoint(self.state_dir, self.last_round, self.loaded.model, self.trainer.state_dict(),
                            self.checkpoint_record(), self.cfg.fingerprint(), keep=self.cfg.checkpoint.keep)
        except CheckpointWriteError as exc:
            self.checkpoint_failures += 1
            log.error("%s", failed_save_line(self.state_dir, self.last_round, exc))
            return False
        self.saved_round = self.last_round
        return True

    def join(self, stop: StopFlag) -> None:
        """Hook: join the swarm if the config asks for it (called once, before the first round)."""

    def start(self) -> None:
        """Hook: before the first round of a fresh run (GRPO: the round-0 evaluation row)."""

    def run_round(self, evaluate: Callable[[], bool] | None = None) -> RoundRow:
        """Run round `last_round + 1` and return its row; `evaluate()` is asked once, after training, whether
        to evaluate it (None: `eval_due`)."""
        raise NotImplementedError

    def progress(self) -> RoundProgress:
        return RoundProgress(self.loaded.name, self.cfg.rounds)

    def leave(self) -> None:
        """Hook: after the last round, before closing (DPO: keep serving until the neighbours have it)."""

    def close(self) -> None:
        self.metrics.close()


class _StopDecision:
    """When a round learns that a stop was asked for: when it is evaluated (modes that evaluate on stop),
    else after it ends. A signal after that point is seen by the next round."""

    def __init__(self, node: RoundNode, stop: StopFlag) -> None:
        self.node, self.stop, self.round, self.taken = node, stop, node.last_round + 1, None

    def evaluate(self) -> bool:
        due = self.node.eval_due(self.round)
        if not self.node.EVALUATES_ON_STOP:
            return due
        self.taken = bool(self.stop)
        return due or self.taken

    def stopping(self) -> bool:
        return self.taken if self.taken is not None else bool(self.stop)


def run_node(make_node: Callable[[], RoundNode], log_level: str = "info") -> int:
    """Run rounds until `rounds` are done or SIGINT/SIGTERM; checkpoint and leave cleanly -> exit code.

    0 after a clean stop with a checkpoint of the last round; 1 when that checkpoint could not be written.
    """
    setup_logging(log_level)
    stop = StopFlag().install()  # before the model loads: a signal while loading still ends cleanly
    node = None
    progress = None
    try:
        node = make_node()
        node.resume()
        progress = node.progress()
        if not stop:
            node.join(stop)
        if node.rounds_done == 0 and not stop:
            node.start()
        stopping = bool(stop)
        while not stopping and not node.finished():
            decision = _StopDecision(node, stop)
            row = node.run_round(decision.evaluate)
            node.metrics.write(row)
            progress.update(row, done=node.rounds_done)
            if node.rounds_done % node.cfg.checkpoint.every_rounds == 0:
                node.checkpoint()
            stopping = decision.stopping()
        if stop:
            log.info("%s received: stopping after round %d", stop.signal_name, node.last_round)
        saved = node.checkpoint()
        node.leave()
        if not saved:
            log.error("exiting without a checkpoint of round %d (see above): a restart resumes from the one "
                      "named there", node.last_round)
            return 1
    finally:
        if progress is not None:
            progress.close()
        if node is not None:
            node.close()
        stop.restore()
    log.info("%s node stopped after round %d", node.MODE, node.last_round)
    return 0
