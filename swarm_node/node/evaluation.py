"""Greedy held-out evaluation: the accuracy the node logs and `swarm-node eval` prints.

Always the transformers backend, so a number means the same on every machine and backend; scoring
matches `models.factory.greedy_accuracy` (prompt text without special tokens, greedy decode,
`task.is_correct` on the decoded completion).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from swarm_node.generation.hf import TransformersGenerator, completion_text
from swarm_node.generation.stops import stop_token_ids
from swarm_node.tasks.base import Task


def evaluate(
    model: Any,
    tokenizer: Any,
    task: Task,
    split: str,
    n: int,
    max_new_tokens: int,
    batch_size: int = 256,
    encode: Callable[[str], list[int]] | None = None,
) -> dict:
    """Greedy exact-match accuracy on the first n prompts of `split`, with mean reward and timing.

    `encode` turns prompt text into ids as the node does (chat template, length cap); default: plain text.
    """
    t0 = time.perf_counter()
    prompts = task.eval_prompts(split, n)
    hits: list[bool] = []
    rewards: list[float] = []
    if prompts:
        gen = TransformersGenerator(
            model, eos_token_id=stop_token_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id,
            batch_size=batch_size,
        )
        ids = [encode(p.text) if encode else tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
        out = gen.generate(ids, 1, max_new_tokens=max_new_tokens, greedy=True)
        for prompt, samples in zip(prompts, out, strict=True):
            text = completion_text(tokenizer, samples[0])
            hits.append(bool(task.is_correct(prompt, text)))
            rewards.append(float(task.reward(prompt, text)))
    return {
        "accuracy": float(np.mean(hits)) if hits else 0.0,
        "n": len(prompts),
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        "split": split,
        "seconds": round(time.perf_counter() - t0, 3),
    }
