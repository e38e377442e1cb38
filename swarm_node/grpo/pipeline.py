"""Pipelined generation (`pipeline: true`): round r+1 is sampled in a background thread while round r trains.

The sampler reads a snapshot of the weights taken before round r's optimizer step, so round r+1's own
samples come from the policy one version behind the one that trains on them. Their behaviour log-probs
are the snapshot's, so F-TIS corrects them exactly as it corrects a peer's one-version-old batch; the
round's metrics and the batch announcement carry that older version.

Only the sampling itself (token ids in, token ids and log-probs out) runs in the thread: prompt encoding
and reward scoring use the tokenizer, which is not safe to share between threads, and stay on the
caller's thread.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from swarm_node.generation import Generator, make_generator
from swarm_node.models.loading import LoadedModel
from swarm_node.training.params import trainable_named


@dataclass
class PendingSamples:
    """A background generation for one round, started from the weights of policy `version`."""

    round: int
    version: int
    generated: float  # unix time the generation started (the batch's age is measured from it)
    context: Any  # what the caller needs to finish the round's samples (prompts, their ids)
    future: Future


class PipelinedSampler:
    """A second sampler whose weights change only when `sync` is called, and one generation in flight.

    transformers: a frozen deep copy of the model (its trainable weights copied in by `sync`); vLLM: the
    engine already holds its own copy, so the node's generator is used and only re-synced between
    generations (never while one runs).
    """

    def __init__(self, loaded: LoadedModel, gen_cfg: Any, generator: Generator):
        if gen_cfg.backend == "transformers":
            snapshot = copy.deepcopy(loaded.model)
            snapshot.requires_grad_(False)
            snapshot.eval()
            self._params = dict(snapshot.named_parameters())
            self._names = [n for n, _ in trainable_named(loaded.model)]
            self.generator = make_generator(dataclasses.replace(loaded, model=snapshot), gen_cfg)
            self.snapshot = snapshot
        else:
            self._params, self._names, self.snapshot = {}, [], None
            self.generator = generator
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline-gen")
        self.pending: PendingSamples | None = None
        self.version = -1  # policy version the sampler's weights hold (-1: not synced yet)

    def sync(self, model: Any, version: int) -> None:
        """Give the sampler `model`'s current weights (policy `version`); never while a generation runs."""
        if self.pending is not None:
            raise RuntimeError("sync() while a pipelined generation is in flight")
        if version == self.version:
            return
        if self.snapshot is None:
            self.generator.sync_weights(model)
        else:
            with torch.no_grad():
                for name, p in trainable_named(model):
                    self._params[name].copy_(p)
        self.version = version

    def start(self, round_: int, context: Any, job: Callable[[Generator], Any]) -> None:
        """Run job(generator) in the background for `round_` with the weights of the last `sync`."""
        if self.pending is not None:
            raise RuntimeError("one pipelined generation at a time")
        self.pending = PendingSamples(round_, self.version, time.time(), context, self._pool.submit(job, self.generator))

    def take(self, round_: int) -> tuple[PendingSamples, Any] | None:
        """Wait for the generation started for `round_` -> (its record, job's result); None if there is none."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        result = pending.future.result()  # an exception in the thread is raised here, on the round's thread
        if pending.round != round_:
            return None  # started for another round (cannot happen in the round loop; never train on it)
        return pending, result

    def close(self) -> None:
        """Let a generation in flight finish (its samples are dropped), then stop the thread."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.future.result()
            except Exception:
                pass
        self._pool.shutdown(wait=True)
