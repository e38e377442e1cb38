"""Rollouts as data: between the generator, the wire and the trainer.

Local samples become TrainGroups and a RolloutBatch to publish; a peer's decoded batch becomes
TrainGroups (`peer_groups`) only where it matches what this node can use (swarm, task, tokenizer, vocab),
each prompt is rebuilt from its id, and (by default) every reward is recomputed locally: peers' claimed
rewards are not trusted. The defences against hostile but well-formed batches (replays, fabricated
log-probs, Sybils) are grpo/defences.py; grpo/admission.py runs both in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarm_node.generation.base import Sample
from swarm_node.generation.hf import completion_text
from swarm_node.node.reasons import Rejections
from swarm_node.protocol import Completion, Group, RolloutBatch
from swarm_node.tasks.base import Prompt, Task
from swarm_node.training.groups import TrainGroup


@dataclass
class LocalRollouts:
    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    samples: list[list[Sample]]
    rewards: list[np.ndarray]

    def train_groups(self, source: str = "local") -> list[TrainGroup]:
        """As training groups; `source` names the generator when these are fed to another node."""
        return [
            TrainGroup(
                prompt_ids=pids,
                completions=[s.token_ids for s in ss],
                behaviour_logprobs=[s.logprobs for s in ss],
                rewards=r,
                source=source,
            )
            for pids, ss, r in zip(self.prompt_ids, self.samples, self.rewards, strict=True)
        ]

    def reward_mean(self) -> float:
        return float(np.mean(np.concatenate(self.rewards))) if self.rewards else float("nan")

    def tokens(self) -> int:
        return int(sum(len(s.token_ids) for ss in self.samples for s in ss))

    def to_batch(self, *, swarm_id: str, task_id: str, tokenizer_fp: str, model_name: str, round_: int,
                 vocab_size: int) -> RolloutBatch:
        # One group per prompt id on the wire: peers decline a repeat (`duplicate_group`), so a task that
        # drew the same prompt twice this round shares only the first group (and still trains on both).
        groups, seen = [], set()
        for p, pids, ss, rs in zip(self.prompts, self.prompt_ids, self.samples, self.rewards, strict=True):
            if p.id in seen:
                continue
            seen.add(p.id)
            groups.append(Group(
                prompt_id=p.id,
                prompt_ids=np.asarray(pids, dtype=np.int64),
                completions=[Completion(s.token_ids, s.logprobs, float(r)) for s, r in zip(ss, rs, strict=True)],
            ))
        return RolloutBatch(swarm_id=swarm_id, task_id=task_id, tokenizer_fp=tokenizer_fp, model_name=model_name,
                            round=round_, vocab_size=vocab_size, groups=groups)


def score(task: Task, tokenizer: Any, prompts: list[Prompt], samples: list[list[Sample]]) -> list[np.ndarray]:
    return [
        np.array([task.reward(p, completion_text(tokenizer, s)) for s in ss], dtype=np.float32)
        for p, ss in zip(prompts, samples, strict=True)
    ]


MAX_TRUSTED_REWARD = 1e6  # claimed rewards beyond this would only poison the group's advantages


@dataclass
class Expectations:
    """What a peer's batch must match for this node to train on it."""

    swarm_id: str
    task_id: str
    tokenizer_fp: str
    vocab_size: int
    trust_peer_rewards: bool = False


@dataclass
class PeerGroups:
    """A peer batch as training groups, and what of it was declined."""

    groups: list[TrainGroup] = field(default_factory=list)
    rejected: Rejections = field(default_factory=Rejections)  # reason -> count (groups or whole batches)
    rewards_changed: int = 0                                   # completions whose claimed reward we overrode


def peer_groups(batch: RolloutBatch, source: str, task: Task, tokenizer: Any, expect: Expectations,
                encode: Callable[[str], list[int]] | None = None) -> PeerGroups:
    """Turn a decoded peer batch into TrainGroups, declining what this node cannot verify or use.

    `encode` is how this node encodes prompts (`PromptEncoder.encode`); default: the plain text.
    """
    out = PeerGroups()
    if batch.swarm_id != expect.swarm_id:
        out.rejected["swarm_mismatch"] += 1
        return out
    if batch.task_id != expect.task_id:
        out.rejected["task_mismatch"] += 1
        return out
    if batch.tokenizer_fp != expect.tokenizer_fp:
        out.rejected["tokenizer_mismatch"] += 1
        return out
    if batch.vocab_size > expect.vocab_size:
        out.rejected["vocab_mismatch"] += 1
        return out
    seen: set[str] = set()
    for g in batch.groups:
        if g.prompt_id in seen:  # one group per prompt: a repeated group would buy its sender extra weight
            out.rejected["duplicate_group"] += 1
            continue
        seen.add(g.prompt_id)
        prompt = task.prompt_from_id(g.prompt_id)
        if prompt is None:
            out.rejected["unknown_prompt"] += 1
            continue
        expected_ids = encode(prompt.text) if encode else tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
        if list(np.asarray(g.prompt_ids).tolist()) != list(expected_ids):
            out.rejected["prompt_mismatch"] += 1
            continue
        if len(g.completions) < 2:
            out.rejected["group_too_small"] += 1
            continue
        # Checked in float64, the wire's type: casting a claim such as 1e300 to float32 first would overflow
        # (with a RuntimeWarning per group) before the range check could refuse it.
        claimed = np.array([c.reward for c in g.completions], dtype=np.float64)
        if expect.trust_peer_rewards:
            if not np.all(np.isfinite(claimed)) or np.any(np.abs(claimed) > MAX_TRUSTED_REWARD):
                out.rejected["reward_out_of_range"] += 1
                continue
            rewards = claimed.astype(np.float32)
        else:
            rewards = np.array(
                [task.reward(prompt, tokenizer.decode(np.asarray(c.token_ids).tolist(), skip_special_tokens=True))
                 for c in g.completions],
                dtype=np.float32,
            )
            out.rewards_changed += int(np.sum(np.abs(rewards - claimed) > 1e-6))
        out.groups.append(
            TrainGroup(
                prompt_ids=np.asarray(g.prompt_ids),
                completions=[np.asarray(c.token_ids) for c in g.completions],
                behaviour_logprobs=[np.asarray(c.logprobs) for c in g.completions],
                rewards=rewards,
                source=source,
            )
        )
    return out
