"""One prompt's group of G completions, as the trainer consumes it, whether sampled here or by a peer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LOCAL = "local"


@dataclass
class TrainGroup:
    """Token ids, behaviour log-probs and rewards of one group; ``source`` is "local" or the peer id.

    Behaviour log-probs are log pi_gen of each sampled token (full vocabulary, sampling temperature),
    one per completion token. The constructor normalizes dtypes and checks that the lengths agree, so a
    malformed group fails here rather than deep inside a forward pass.
    """

    prompt_ids: list[int] | np.ndarray
    completions: list[np.ndarray]
    behaviour_logprobs: list[np.ndarray]
    rewards: np.ndarray
    source: str = LOCAL

    def __post_init__(self) -> None:
        self.prompt_ids = np.asarray(self.prompt_ids, dtype=np.int64).reshape(-1)
        self.completions = [np.asarray(c, dtype=np.int64).reshape(-1) for c in self.completions]
        self.behaviour_logprobs = [
            np.asarray(b, dtype=np.float32).reshape(-1) for b in self.behaviour_logprobs
        ]
        self.rewards = np.asarray(self.rewards, dtype=np.float32).reshape(-1)
        if self.prompt_ids.size == 0:
            raise ValueError(
                "a group needs a non-empty prompt (the first completion token is predicted from it)"
            )
        g = len(self.completions)
        if g == 0 or len(self.behaviour_logprobs) != g or self.rewards.size != g:
            raise ValueError(
                f"group sizes disagree: {g} completions, {len(self.behaviour_logprobs)} behaviour "
                f"log-prob arrays, {self.rewards.size} rewards"
            )
        for i, (c, b) in enumerate(zip(self.completions, self.behaviour_logprobs, strict=True)):
            if c.size != b.size:
                raise ValueError(f"completion {i}: {c.size} tokens but {b.size} behaviour log-probs")
        if not self.source:
            raise ValueError("source must be 'local' or a peer id")

    @property
    def is_local(self) -> bool:
        return self.source == LOCAL

    @property
    def size(self) -> int:
        return len(self.completions)
