"""The Generator interface: G completions per prompt, with the behaviour log-probs actually sampled from.

Behaviour log-probs are log-softmax over the full vocabulary at the sampling temperature, taken at the
sampled token: exactly the distribution the token was drawn from (no top-k/top-p truncation), which is
what the F-TIS importance ratio needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Sample:
    token_ids: np.ndarray   # int64, completion tokens (includes the EOS token when finished)
    logprobs: np.ndarray    # float32, behaviour log-prob of each completion token
    finished: bool          # True if it ended with EOS (else it hit max_new_tokens)


class Generator(ABC):
    @abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        num_generations: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[list[Sample]]:
        """For each prompt (token ids), `num_generations` samples; result[i][j] is sample j of prompt i."""

    def sync_weights(self, model: Any) -> None:
        """Make generation use `model`'s current weights; call after every optimizer step.

        A no-op for backends that sample from the training model itself (transformers); an engine with
        its own copy of the weights (vLLM) overrides it, or it would keep sampling from a stale policy.
        """
        return None
