"""Greedy held-out evaluation: the accuracy the node logs, `swarm-node eval` prints and the preset factory
measures during warm-up.

The transformers backend by default: prompt text without special tokens, greedy decode, `task.is_correct` on
the decoded completion. A vLLM node evaluates through its own engine instead (200 prompts x 512 tokens take
minutes through transformers on a GPU); greedy decoding gives the same completions up to ties and the
engine's precision (tests/test_vllm_node.py compares them). Tasks with parts
(arithmetic's operators and signed format, reasoning-gym's datasets, a files task's part field) also get an
accuracy per part; the union's accuracy is their mean weighted by each part's problem count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from swarm_node.generation.base import Generator
from swarm_node.generation.hf import TransformersGenerator, completion_text
from swarm_node.generation.stops import stop_token_ids
from swarm_node.tasks.base import Prompt, Task


def score_prompts(
    model: Any,
    tokenizer: Any,
    task: Task,
    prompts: list[Prompt],
    max_new_tokens: int,
    batch_size: int = 256,
    encode: Callable[[str], list[int]] | None = None,
    generator: Generator | None = None,
) -> tuple[list[bool], list[float]]:
    """(correct, reward) of the greedy completion of each prompt.

    `encode` turns prompt text into ids as the node does (chat template, length cap); default: plain text.
    The model stops at any of its stop ids (generation_config's EOS ids, or the tokenizer's). `generator`:
    decode with it (a vLLM node's engine) instead of a transformers generator on `model`.
    """
    if not prompts:
        return [], []
    gen = generator or TransformersGenerator(
        model, eos_token_id=stop_token_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id,
        batch_size=batch_size,
    )
    ids = [encode(p.text) if encode else tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    out = gen.generate(ids, 1, max_new_tokens=max_new_tokens, greedy=True)
    hits: list[bool] = []
    rewards: list[float] = []
    for prompt, samples in zip(prompts, out, strict=True):
        text = completion_text(tokenizer, samples[0])
        hits.append(bool(task.is_correct(prompt, text)))
        rewards.append(float(task.reward(prompt, text)))
    return hits, rewards


def greedy_accuracy(model: Any, tokenizer: Any, task: Task, prompts: list[Prompt], max_new_tokens: int = 8,
                    batch_size: int = 256) -> float:
    """Greedy exact-match accuracy on a list of prompts (0.0 for none)."""
    hits, _ = score_prompts(model, tokenizer, task, prompts, max_new_tokens, batch_size)
    return float(np.mean(hits)) if hits else 0.0


def evaluate(
    model: Any,
    tokenizer: Any,
    task: Task,
    split: str,
    n: int,
    max_new_tokens: int,
    batch_size: int = 256,
    encode: Callable[[str], list[int]] | None = None,
    generator: Generator | None = None,
) -> dict:
    """Greedy exact-match accuracy on the first n prompts of `split`, with mean reward and timing.

    When the task has parts (`task.part_of`), `by_part` holds each part's accuracy and problem count; `hits`
    is every problem's 0/1 in order (so two runs scored on the same problems can be paired).
    """
    t0 = time.perf_counter()
    prompts = task.eval_prompts(split, n)
    hits, rewards = score_prompts(model, tokenizer, task, prompts, max_new_tokens, batch_size, encode, generator)
    result = {
        "accuracy": float(np.mean(hits)) if hits else 0.0,
        "n": len(prompts),
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        "split": split,
        "seconds": round(time.perf_counter() - t0, 3),
        "hits": "".join("1" if h else "0" for h in hits),
    }
    parts = accuracy_by_part(task, prompts, hits)
    if parts:
        result["by_part"] = parts
    return result


def accuracy_by_part(task: Task, prompts: list[Prompt], hits: list[bool]) -> dict[str, dict]:
    """{part: {"accuracy", "n"}} in the task's part order, for the parts that have problems here ({} for a
    task without parts, or prompts outside them: ood_formats, ood3)."""
    groups: dict[str, list[bool]] = {}
    for p, h in zip(prompts, hits, strict=True):
        part = task.part_of(p)
        if part is not None:
            groups.setdefault(part, []).append(h)
    order = [q for q in task.parts if q in groups]
    return {q: {"accuracy": float(np.mean(groups[q])), "n": len(groups[q])} for q in order}


def eval_metrics(ev: dict) -> dict:
    """An `evaluate` result as metrics.jsonl keys: eval_accuracy, eval_n, eval_hits and, for tasks with parts,
    eval_acc_parts / eval_n_parts ({part: value}; the union is eval_accuracy)."""
    row = {"eval_accuracy": ev["accuracy"], "eval_n": ev["n"], "eval_hits": ev.get("hits")}
    if ev.get("by_part"):
        row["eval_acc_parts"] = {k: v["accuracy"] for k, v in ev["by_part"].items()}
        row["eval_n_parts"] = {k: v["n"] for k, v in ev["by_part"].items()}
    return row
