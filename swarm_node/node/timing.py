"""Where a round's time goes: seconds per phase (sample, score, exchange, train, eval), one row per round.

The metrics row carries them as `time_split_s`, so a slow round says which part was slow: on a real
model sampling and training dominate, on the tiny presets the exchange can. Phases may nest in no
particular order; a phase entered twice in a round adds up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("sample", "score", "exchange", "train", "eval")


class RoundClock:
    """Seconds per phase of the current round; `start()` begins a new round."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def start(self) -> None:
        self.seconds = {}

    def add(self, phase: str, seconds: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
        self.seconds[phase] = self.seconds.get(phase, 0.0) + float(seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def split(self) -> dict[str, float]:
        """{phase: seconds} of this round, every phase listed (0 for one that did not run), rounded to 0.1 ms."""
        return {p: round(self.seconds.get(p, 0.0), 4) for p in PHASES}
