"""The mix: how often a node samples each part of its task's universe (a local setting, never on the wire).

`parse_mix` is the one check of a user's `task.mix` (or reasoning-gym weights): every problem is one line
naming the key and what is allowed, so a node stops at start with exit 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from swarm_node.errors import UserFacingError


def parse_mix(mix: Any, parts: Sequence[str], default: Mapping[str, float], what: str = "task.mix") -> dict[str, float]:
    """{part: share} over all `parts` (missing parts get 0), shares summing to 1.

    `mix` is None (take `default`) or a mapping part -> non-negative finite number, at least one positive.
    """
    if mix is None:
        mix = default
    if not isinstance(mix, Mapping):
        raise UserFacingError(f"{what} must be a mapping part -> weight (parts: {', '.join(parts)}), "
                              f"got {mix!r}")
    weights = {p: 0.0 for p in parts}
    for key, value in mix.items():
        if key not in weights:
            raise UserFacingError(f"{what}: unknown part {key!r}; this task's parts are {', '.join(parts)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise UserFacingError(f"{what}.{key} must be a non-negative number, got {value!r}")
        weights[key] = float(value)
    total = sum(weights.values())
    if total <= 0:
        raise UserFacingError(f"{what}: every weight is 0; give at least one part a positive weight "
                              f"(parts: {', '.join(parts)})")
    return {p: w / total for p, w in weights.items()}


def describe_mix(mix: Mapping[str, float]) -> str:
    """'add 0.50, sub 0.50' (parts with weight 0 left out): for logs and the round-0 metrics row."""
    return ", ".join(f"{p} {w:.2f}" for p, w in mix.items() if w > 0)
