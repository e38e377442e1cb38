"""The Generator interface: G completions per prompt, with the behaviour log-probs actually sampled from.

Behaviour log-probs are log-softmax over the full vocabulary at the sampling temperature, taken at the
sampled token: exactly the distribution the token was drawn from (no top-k/top-p truncation), which is
what the F-TIS importance ratio needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Sample:
    token_ids: np.ndarray   # int64, completion tokens (includes the EOS token when finished)
    logprobs: np.ndarray    # float32, behaviour log-prob of each completion token
    finished: bool          # True if it ended with EOS (else it hit max_new_tokens)


def check_request(prompts: Sequence[Sequence[int]], num_generations: int, max_new_tokens: int,
                  temperature: float, greedy: bool) -> None:
    """The argument checks every backend shares: a ValueError before any work is done."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")


class Generator(ABC):
    """A sampler. `generate` is the one entry point: it checks the request once for every backend, then
    the backend's `_sample` does the work."""

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
        """For each prompt (token ids), `num_generations` samples; result[i][j] is sample j of prompt i.

        `greedy` decodes the argmax (its log-probs are reported at T=1); otherwise tokens are sampled at
        `temperature`, reproducibly for a given `seed`.
        """
        check_request(prompts, num_generations, max_new_tokens, temperature, greedy)
        if not prompts:
            return []
        return self._sample(prompts, num_generations, max_new_tokens=max_new_tokens, temperature=temperature,
                            greedy=greedy, seed=seed)

    @abstractmethod
    def _sample(self, prompts: list[list[int]], num_generations: int, *, max_new_tokens: int, temperature: float,
                greedy: bool, seed: int | None) -> list[list[Sample]]:
        """The backend's sampling, on a request `generate` has checked (at least one non-empty prompt)."""

    def sync_weights(self, model: Any) -> None:
        """Make generation use `model`'s current weights; call after every optimizer step.

        A no-op for backends that sample from the training model itself (transformers); an engine with
        its own copy of the weights (vLLM) overrides it, or it would keep sampling from a stale policy.
        """
        return None

    def release(self) -> None:
        """Give memory back before a training step (vLLM on a GPU: sleep mode); `resume` undoes it."""
        return None

    def close(self) -> None:
        """Free what the backend holds (an engine, its memory, process-wide state); idempotent."""
        return None

    def resume(self, model: Any, changed: bool = True) -> None:
        """After a training step: take the memory back and, if the step `changed` the model (or the release
        dropped the weights), its weights."""
        if changed:
            self.sync_weights(model)
