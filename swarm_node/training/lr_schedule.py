"""Learning rate per round: optional linear warm-up, then constant, linear or cosine decay.

A function of the round alone (no scheduler state), so a resumed node continues the same curve.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(schedule: str, step: int, warmup: int = 0, total: int | None = None) -> float:
    """Multiplier of the base learning rate for the 0-based optimizer round `step`.

    Warm-up: (step + 1) / warmup for the first `warmup` rounds (the first round already moves, unlike a
    schedule that starts at 0). Decay: from 1 after the warm-up towards 0 at `total`, never reaching it (the
    last round still trains), as transformers' linear and cosine schedules do.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; expected one of {SCHEDULES}")
    step = max(step, 0)
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if total is None:
        raise ValueError(f"lr schedule {schedule!r} needs the total number of rounds")
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
