"""A GRPO node for a benchmark, and its held-out score.

Every benchmark that trains nodes in-process builds their config with `node_config`, so the settings that
make its tables comparable with the others' (the arithmetic task, 16 prompts x G = 8 completions a round,
6 new tokens, n = 400 held-out problems) are written once, and scores them with `heldout_score`, which
is the node's own evaluation (`swarm_node.evaluation` with the node's PromptEncoder, its max_new_tokens
and eval batch size, as `GRPONode.evaluate` runs it). So prompts are encoded exactly as the node samples
them (chat template, length cap) whatever the model, and a benchmark cannot drift from what a node logs.
A benchmark that needs another setting (a committed table scored with 8 new tokens) passes it by name.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch

from swarm_node.config import NodeConfig
from swarm_node.evaluation import score_prompts
from swarm_node.grpo.round import GRPONode

NEVER = 10**6  # a round period that never comes: benchmarks score when they choose, not every k rounds


def node_config(model: str | dict, seed: int, *, prompts: int = 16, eval_n: int = 400, generations: int = 8,
                max_new_tokens: int = 6, training: dict | None = None, task: dict | None = None,
                generation: dict | None = None, **sections: Any) -> NodeConfig:
    """A validated NodeConfig: `model` a path/preset name or a `model` section; `task`, `generation` and
    `training` entries are merged over the benchmark defaults; other sections (`rounds`, `pipeline`,
    `metrics`, ...) go in as given. The periodic eval inside `run_round` is off unless `metrics` says so."""
    spec: dict[str, Any] = {
        "seed": seed,
        "model": {"path": model} if isinstance(model, str) else dict(model),
        "task": {"name": "arithmetic", "prompts_per_round": prompts, "eval_n": eval_n, **(task or {})},
        "generation": {"num_generations": generations, "max_new_tokens": max_new_tokens, **(generation or {})},
        "training": dict(training or {}),
        "metrics": {"eval_every": NEVER},
        **sections,
    }
    return NodeConfig.model_validate(spec)


def grpo_node(cfg: NodeConfig, workdir: Path) -> GRPONode:
    """The node of `cfg` in `workdir` (it seeds torch with cfg.seed itself, before model init and LoRA:
    node/loop.py `RoundNode.__init__`)."""
    return GRPONode(cfg, workdir)


class HeldOutScore(NamedTuple):
    accuracy: float   # greedy exact match, 0.0 for no problems
    hits: list[bool]  # per problem, in the split's order (for paired differences)


def heldout_score(node: GRPONode, split: str | None = None, n: int | None = None, *,
                  max_new_tokens: int | None = None, batch_size: int | None = None) -> HeldOutScore:
    """Greedy accuracy and per-problem hits on the first n problems of `split`, scored as the node's own
    evaluation scores them (defaults: its eval split and n, its max_new_tokens, its eval batch size)."""
    g = node.cfg.generation
    prompts = node.task.eval_prompts(split or node.cfg.task.eval_split, node.cfg.task.eval_n if n is None else n)
    hits, _ = score_prompts(node.loaded.model, node.tok, node.task, prompts,
                            g.max_new_tokens if max_new_tokens is None else max_new_tokens,
                            max(g.batch_size, 64) if batch_size is None else batch_size, node.prompts.encode)
    hits = [bool(h) for h in hits]
    return HeldOutScore(float(np.mean(hits)) if hits else 0.0, hits)


T = TypeVar("T")


def one_thread() -> None:
    """Torch on one thread in this process: tiny models, one thread per process beats contended ones."""
    torch.set_num_threads(1)


def run_jobs(run: Callable[[Any], T], jobs: Sequence[Any], workers: int, report: Callable[[T], None]) -> None:
    """`report(run(job))` for every job, in job order (so a benchmark's printout and JSON are deterministic):
    here when `workers` <= 1, else in `workers` spawned interpreters (no forked torch state), one thread
    each. `run` must be a module-level function (the workers import it)."""
    if workers <= 1:
        for job in jobs:
            report(run(job))
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=one_thread) as pool:
        for out in pool.map(run, jobs):
            report(out)
