"""The demo's live table: with the peers' alone runs done, each swarm peer's gain over alone so far, with its SE
paired over the eval problems, the same numbers the report ends with (one function, stats.gain_with_se).

Fed by recorded metrics of a real default demo (tests/data/report_golden/specialised: 3 specialised peers,
60 rounds, alone then swarm, 1200 eval problems), read through the real table code, no processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from swarm_node.node.metrics import read_metrics
from swarm_node.runs.live import LiveTable, gain_so_far
from swarm_node.runs.local_swarm import Peer

RUN = Path(__file__).resolve().parent / "data" / "report_golden" / "specialised"
EXPECTED = json.loads((RUN.parent / "specialised.report.json").read_text())
PEERS = sorted(EXPECTED["gain_over_alone"])


def _peers(arm: str) -> list[Peer]:
    return [Peer(name=p, config=RUN / "none.yaml", state_dir=RUN / arm / p) for p in PEERS]


def _baseline() -> dict[str, Path]:
    return {p: RUN / "alone" / p / "metrics.jsonl" for p in PEERS}


def test_the_live_gain_at_the_last_round_is_the_reports():
    for p in PEERS:
        g = gain_so_far(read_metrics(RUN / "swarm" / p / "metrics.jsonl"), read_metrics(_baseline()[p]))
        want = EXPECTED["gain_over_alone"][p]
        assert g["round"] == 60 and g["paired"], (p, g)
        assert g["gain"] == pytest.approx(want["gain"]) and g["se"] == pytest.approx(want["se"]), p
        assert g["verdict"] == want["verdict"]


def test_the_live_gain_pairs_the_same_round_problem_by_problem():
    """Mid-run (the swarm at round 30): the swarm's eval at 30 against alone's eval at 30, not alone's last."""
    p = PEERS[0]
    swarm = [r for r in read_metrics(RUN / "swarm" / p / "metrics.jsonl") if r["round"] <= 32]
    alone = read_metrics(_baseline()[p])
    s30 = next(r for r in swarm if r["round"] == 30 and r.get("eval_hits"))
    a30 = next(r for r in alone if r["round"] == 30 and r.get("eval_hits"))
    d = np.array([int(x) - int(y) for x, y in zip(s30["eval_hits"], a30["eval_hits"], strict=True)])
    g = gain_so_far(swarm, alone)
    assert g["round"] == 30 and g["gain"] == pytest.approx(d.mean())
    assert g["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(d.size))
    assert gain_so_far(swarm[:1], alone) is None  # round 0 only: the same model, nothing to show yet
    assert gain_so_far(swarm, []) is None  # no alone run


def test_the_table_shows_a_gain_column_only_with_a_baseline(capsys):
    from rich.console import Console

    with_base = LiveTable("swarm: 60 rounds", _peers("swarm"), 60, baseline=_baseline())
    console = Console(width=250, record=True)
    console.print(with_base._table())
    text = console.export_text()
    assert "gain over alone" in text
    for p in PEERS:
        g = EXPECTED["gain_over_alone"][p]
        assert f"{g['gain']:+.3f} +- {g['se']:.3f} ({g['verdict']}, r60)" in text, (p, text)
    plain = Console(width=250, record=True)
    plain.print(LiveTable("alone: 60 rounds", _peers("alone"), 60)._table())
    assert "gain over alone" not in plain.export_text()

    with_base.tty, with_base.min_interval_s = False, 0.0  # a pipe: one compact line
    with_base.refresh()
    line = capsys.readouterr().out
    g = EXPECTED["gain_over_alone"][PEERS[0]]
    assert f"{PEERS[0]} r60/60" in line and f"gain {g['gain']:+.2f}+-{g['se']:.2f}" in line, line
