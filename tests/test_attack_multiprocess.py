"""Honest GRPO nodes beside a misbehaving peer (tooling/adversary.py), as real processes on 127.0.0.1.

Two swarms run side by side: an honest tiny-s node alone, and the same seeded node with the adversary
running every attack mode, one after another. For each attack the honest node counts the rejection by
its reason; it keeps its pace, its parameters stay finite, and its accuracy curve stays close to the run
without the attacker. Timing is compared side by side in one run, never against a fixed time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarm_node.config import load_config
from swarm_node.runs.local_swarm import write_peer_config
from swarm_node.swarm.receiver import BatchReceiver
from tooling.adversary import MODES, STALLER_BYTES, honest_overrides, run_side_by_side, summarize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PACE_FRACTION = 0.7  # attacked rounds per second (after round 1) >= 70% of the baseline's, side by side
ACC_TOLERANCE = 0.2  # |accuracy difference| at every common eval point (eval_n = 50: one sample is 0.02)


def test_a_silent_stallers_download_is_cut_off_as_stalled_well_before_its_deadline(tmp_path) -> None:
    """stall_announce expects `swarm:stalled`: the stall cut-off (download_stall_s after the stream opened)
    must come well before the download's whole deadline (download_deadline_s of the announced size), else
    a slow open under load lets the deadline cut it off first, counted `timeout` (20 kB left 0.3 s)."""
    cfg = load_config(write_peer_config(Path(__file__).resolve().parents[1] / "peers" / "tiny-s.yaml",
                                        tmp_path / "honest.yaml", honest_overrides("x", 1))).swarm
    deadline = BatchReceiver.download_deadline_s(SimpleNamespace(cfg=cfg), STALLER_BYTES)
    assert deadline - cfg.download_stall_s >= 2.5, (deadline, cfg.download_stall_s)


@pytest.fixture(scope="module")
def attacked(presets_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attack")
    run = run_side_by_side(tmp, presets_dir, modes=list(MODES), timeout_s=600)
    s = summarize(run)
    (tmp / "summary.json").write_text(json.dumps({**s, "wall_s": run["wall_s"]}, default=str))  # for a reader
    return run, s


def test_both_nodes_finish_and_the_adversary_ran_every_mode(attacked) -> None:
    run, s = attacked
    assert run["codes"] == {"baseline": 0, "attacked": 0}, run["logs"]
    assert run["adversary_done"] and set(run["report"]["modes"]) == set(MODES), run["logs"]["adversary"]
    assert not run["report"].get("errors"), run["report"]["errors"]


@pytest.mark.parametrize("mode", list(MODES))
def test_each_attack_is_counted_by_its_reason(attacked, mode) -> None:
    _run, s = attacked
    assert s["modes"][mode]["counted"], (mode, MODES[mode], s["modes"][mode]["reasons"])


def test_the_honest_node_keeps_pace_stays_finite_and_learns_alike(attacked) -> None:
    run, s = attacked
    assert s["pace_ratio"] >= PACE_FRACTION, s["rounds"]
    assert s["params_finite"] == {"baseline": True, "attacked": True}
    assert s["loss_finite"]
    assert len(s["acc_rounds"]) >= 3 and not math.isnan(s["max_abs_acc_delta"])
    assert s["max_abs_acc_delta"] <= ACC_TOLERANCE, list(zip(s["acc_rounds"], s["acc_delta"], strict=True))
