"""The Task interface: a stream of prompts with stable ids and a reward computed locally from text.

Prompt ids are stable across nodes: a receiver rebuilds the prompt (and its reference answer) from the
id alone with `prompt_from_id`, so it can recompute the reward of a peer's completion instead of trusting
the peer's claim.

A task has a *universe* and a *mix*. The universe is everything a receiver needs to rebuild a prompt from
its id and score it (the problem space, datasets and their configs, the data file); its id, `task_id`,
goes on the wire, and peers of another universe are declined. The mix is how often this node samples each
part of the universe (`parts`: operators, datasets, ...): a local setting, not on the wire, so peers with
different mixes train together.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Prompt:
    id: str        # stable across nodes, e.g. "arith:id:12+7" or "gsm8k:<data fp>:417"
    text: str      # what the model is conditioned on
    answer: str    # reference answer used by the reward


class Task(ABC):
    """A verifiable task. `task_id` names its universe and goes on the wire; peers with another are declined.

    The mix (`mix`: part -> share of this node's training prompts) is local: it is not part of `task_id`.
    """

    task_id: str
    splits: tuple[str, ...] = ("id",)
    parts: tuple[str, ...] = ()  # the universe's parts (eval reports each); empty: the task is one part
    mix: dict[str, float] = {}   # part -> share of this node's training prompts (sums to 1); empty: no parts

    def part_of(self, prompt: Prompt) -> str | None:
        """The part a prompt belongs to (evaluation per part); None when the task has no parts."""
        return None

    @abstractmethod
    def train_prompts(self, n: int, rng: np.random.Generator) -> list[Prompt]:
        """n training prompts (never from the held-out eval sets)."""

    @abstractmethod
    def eval_prompts(self, split: str, n: int) -> list[Prompt]:
        """The first n prompts of a fixed, held-out eval split (deterministic)."""

    @abstractmethod
    def reward(self, prompt: Prompt, completion: str) -> float:
        """Reward of a completion, computed locally (finite float)."""

    @abstractmethod
    def prompt_from_id(self, prompt_id: str) -> Prompt | None:
        """Rebuild a prompt from its id (for peers' samples); None if the id is not one of ours."""

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        """Exact correctness used by eval accuracy (default: full reward)."""
        return self.reward(prompt, completion) >= 1.0
