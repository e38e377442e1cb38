"""hivemind's DecentralizedAverager, failing a step whose average came back incomplete.

In a butterfly all-reduce each member averages one part of the vector for the whole group. When a member
fails to return its part (a lost stream, a BAD_GROUP_ID race under load), hivemind keeps *our own* values
for that part, logs "received N% results" in the averager's process, and reports success. The node would
then log a full federated average it did not get, and end the round unlike its groupmates (CI, 2026-12-05:
one node of three off by 0.14 in three of four probed values). Here such a step fails instead, so the node
keeps its parameters and its row says the group was missing.
"""

from __future__ import annotations

from typing import Any

from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.partition import AllreduceException, TensorPartContainer

_LOST = [0]
"""Values, in this (the averager's) process, whose reducer never answered and that hivemind filled with ours."""


def count_lost_parts() -> None:
    """Count what TensorPartContainer.register_failed_reducer fills in, in this process (idempotent)."""
    fill = TensorPartContainer.register_failed_reducer
    if getattr(fill, "counted", False):
        return

    def counted(self: TensorPartContainer, peer_index: int) -> None:
        before = self.failed_size
        fill(self, peer_index)
        _LOST[0] += self.failed_size - before

    counted.counted = True  # type: ignore[attr-defined]
    TensorPartContainer.register_failed_reducer = counted  # type: ignore[method-assign]


class CheckedAverager(DecentralizedAverager):
    """A DecentralizedAverager whose step raises when any part of the average was not received."""

    def run(self) -> None:  # the averager's own process
        count_lost_parts()
        super().run()

    async def _aggregate_with_group(self, group_info: Any, min_vector_size: int, **kwargs: Any) -> Any:
        before = _LOST[0]
        gathered = await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
        lost = _LOST[0] - before
        if lost:
            raise AllreduceException(f"{lost} of {self.total_size} values came back unaveraged "
                                     "(a groupmate did not return its part)")
        return gathered
