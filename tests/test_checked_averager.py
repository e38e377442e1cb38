"""The all-reduce backend fails a step whose average came back incomplete instead of reporting it averaged,
and one whose groupmate stalls instead of waiting for it forever.

Two real hivemind averagers on a local DHT; one is a faulty groupmate that answers every part it should
average with INTERNAL_ERROR. hivemind's own averager then fills that part with our values and reports a
successful step (what the CI failure of 2026-12-05 showed); CheckedAverager raises. Another groupmate
freezes once the group has formed (a second CI failure of that day: one node hung until it was killed);
the node's backend gives up on it after its deadline and keeps its own parameters.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import hivemind
import pytest
import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.proto import averaging_pb2

from swarm_node.config import DPOConfig, SwarmConfig
from swarm_node.dpo.mixing import allreduce_result
from swarm_node.swarm.averaging.allreduce import AllReduce, group_members, group_settings
from swarm_node.swarm.averaging.checked_averager import CheckedAverager

SIZE = 1000


class FaultyReducer(CheckedAverager):
    """Joins groups and sends its part, but never averages the part it was given (named CheckedAverager:
    hivemind names its handlers after the class, and groups form only between the same handlers)."""

    async def rpc_aggregate_part(self, stream: Any, context: Any) -> Any:
        async for _ in stream:  # take everything first: the sender's stream closes cleanly
            pass
        yield averaging_pb2.AveragingData(code=averaging_pb2.INTERNAL_ERROR)


class FrozenGroupmate(CheckedAverager):
    """Joins a group and freezes (SIGSTOP) before the all-reduce: a groupmate on an overloaded machine. Its
    p2pd keeps the streams open, so the others hear nothing, not even a closed stream."""

    async def _aggregate_with_group(self, *args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGSTOP)
        return await super()._aggregate_with_group(*args, **kwargs)


for _cls in (FaultyReducer, FrozenGroupmate):
    _cls.__name__ = CheckedAverager.__name__  # the handlers' names, which the honest one calls


def _steps(averagers: list[DecentralizedAverager]) -> list[Any]:
    """Step every averager at once (each blocks until the group forms); their results or exceptions."""
    out: list[Any] = [None] * len(averagers)

    def step(i: int) -> None:
        try:
            out[i] = averagers[i].step(gather=f"peer{i}", timeout=20, allow_retries=False)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=step, args=(i,)) for i in range(len(averagers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    return out


def _pair(first: type, second: type, **first_kw: Any) -> tuple[list[hivemind.DHT], list[DecentralizedAverager]]:
    a = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    b = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                     initial_peers=[str(m) for m in a.get_visible_maddrs()])
    kw = dict(start=True, prefix="checked", target_group_size=2, min_group_size=2, min_matchmaking_time=2.0,
              request_timeout=1.0, allreduce_timeout=10.0)
    avs = [first([torch.ones(SIZE)], a, **kw, **first_kw), second([torch.zeros(SIZE)], b, **kw)]
    return [a, b], avs


def _close(dhts: list[hivemind.DHT], avs: list[DecentralizedAverager]) -> None:
    for av in avs:
        av.shutdown()
    for d in dhts:
        d.shutdown()


@pytest.mark.slow
def test_an_incomplete_average_fails_the_step_instead_of_passing_for_a_mean() -> None:
    # in client mode we average no part ourselves: the faulty groupmate is given all of it
    dhts, avs = _pair(CheckedAverager, FaultyReducer, client_mode=True)
    try:
        honest, _ = _steps(avs)
        with avs[0].get_tensors() as ts:
            after = ts[0].clone()
    finally:
        _close(dhts, avs)
    assert isinstance(honest, Exception), f"step reported success: {honest}"
    # (hivemind's own allreduce_timeout sometimes ends the step first, when the faulty groupmate's stream
    # stalls: a failure too, and the tensors are the same)
    # what hivemind's own averager reports as the mean: our own vector, untouched
    assert torch.equal(after, torch.ones(SIZE))


@pytest.mark.slow
def test_two_checked_averagers_average_and_say_who_they_averaged_with() -> None:
    dhts, avs = _pair(CheckedAverager, CheckedAverager)
    try:
        results = _steps(avs)
        with avs[0].get_tensors() as ts:
            after = ts[0].clone()
    finally:
        _close(dhts, avs)
    assert all(isinstance(r, dict) for r in results), results
    assert torch.allclose(after, torch.full((SIZE,), 0.5), atol=1e-3)
    assert group_members(results[0].values(), "peer0") == ["peer1"]


def test_group_members_drops_us_and_names_anything_odd_unknown() -> None:
    assert group_members(["b", "me", "a"], "me") == ["a", "b"]
    assert group_members(["me", 7, "x" * 500, ""], "me") == ["unknown"]


@pytest.mark.slow
def test_a_frozen_groupmate_costs_the_node_one_round_not_its_run() -> None:
    """The node's all-reduce backend beside a groupmate that froze once the group formed: the node keeps its own
    parameters, names the groupmate missing, and goes on (hivemind's default waits forever)."""
    frozen_dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    own = [torch.ones(SIZE)]
    swarm = SwarmConfig(swarm_id="stall", host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True,
                        initial_peers=[str(m) for m in frozen_dht.get_visible_maddrs()])
    node = AllReduce(DPOConfig(gossip_deadline_s=5.0, aggregation="mean"), swarm, own, "fp")
    frozen = FrozenGroupmate([torch.zeros(SIZE)], frozen_dht, start=True, prefix=node.prefix, **group_settings(2))
    node._ensure(2)  # hivemind starts its process from the main thread only
    out: list[Any] = []
    frozen_step = frozen.step(gather="peer1", timeout=20, allow_retries=False, wait=False)
    worker = threading.Thread(target=lambda: out.append(allreduce_result(node, own, ["peer0", "peer1"], "peer0")),
                              daemon=True)
    worker.start()
    worker.join(60)
    try:
        assert out, "average() still waiting on the frozen groupmate after 60 s"
        result = out[0]
        assert result.missing == ["peer1"] and result.present == []
        assert torch.equal(result.params[0], torch.ones(SIZE))
    finally:
        os.kill(frozen.pid, signal.SIGKILL)  # frozen: it would not hear a shutdown
        node.close()
        frozen_dht.shutdown()
        del frozen_step  # held until here: a collected step cancels itself
