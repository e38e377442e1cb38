"""`swarm-node demo` and `swarm-node report` end to end, as a user runs them (subprocesses, 127.0.0.1).

One short default demo (the specialised peers, alone first then the swarm, 2 rounds per arm) feeds every
test: report.json numbers, each peer's gain over alone with its SE, the PNG plots, and regenerating the
report from the metrics files alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from swarm_node.runs.stats import verdict

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test may build the presets

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PEERS = ("tiny-s", "tiny-m", "tiny-s-lora")


@pytest.fixture(scope="session")
def demo_presets(presets_dir: Path) -> Path:
    """The session's built presets (conftest), shared with the demo's peer processes."""
    return presets_dir


def _cli(*args: str, presets: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "SWARM_NODE_PRESETS": str(presets), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "swarm_node.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo_out(demo_presets, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("demo") / "out"
    t0 = time.monotonic()
    res = _cli("demo", "--rounds", "2", "--out", str(out), "--dashboard-port", "0", presets=demo_presets, timeout=400)
    return {"out": out, "res": res, "seconds": time.monotonic() - t0}


def _check_pngs(out: Path) -> None:
    for name in ("reward.png", "accuracy.png"):
        data = (out / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), name


def test_demo_writes_report_and_plots(demo_out):
    res, out = demo_out["res"], demo_out["out"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "[demo] report:" in res.stdout
    assert res.stdout.startswith("[demo] dashboard: http://127.0.0.1:")  # the live page's address comes first
    report = json.loads((out / "report.json").read_text())
    assert report["rounds"] == 2 and report["peers"] == list(PEERS)
    assert set(report["arms"]) == {"swarm", "alone"}
    for arm, peers in report["arms"].items():
        assert set(peers) == set(PEERS), arm
        for name, s in peers.items():
            assert s["rounds"] == 2, (arm, name)
            for key in ("start_accuracy", "end_accuracy", "best_accuracy"):
                assert isinstance(s[key], float) and 0.0 <= s[key] <= 1.0, (arm, name, key, s[key])
            assert [r for r, _ in s["accuracy_curve"]] == [0, 2]
            # groups with a learning signal: some of the 2 x 16 prompts, never more
            assert 0 < s["local_groups"] <= 2 * 16, (arm, name, s["local_groups"])
            if arm == "swarm":
                assert s["external_groups"] > 0 and s["bytes_out"] > 0 and s["bytes_in"] > 0, (name, s)
                assert s["external_groups_by_peer"] and all(":" in k for k in s["external_groups_by_peer"])
                assert s["rewards_overridden"] == 0  # honest peers: every claim matches the local recomputation
            else:
                assert s["external_groups"] == 0 and s["bytes_out"] == 0 and s["bytes_in"] == 0, (name, s)
    md = (out / "report.md").read_text()
    assert all(f"| {p} | swarm |" in md and f"| {p} | alone |" in md for p in PEERS)
    _check_pngs(out)
    for arm in ("swarm", "alone"):
        for p in PEERS:
            assert (out / arm / p / "metrics.jsonl").is_file()
            assert (out / arm / p / "node.log").is_file()


def _end_eval(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("eval_hits")][-1]


def test_default_demo_reports_each_peers_gain_over_alone_with_its_se(demo_out):
    """The default's payoff: every peer's swarm end minus its alone end on the same 1200 problems (400 a part),
    +- the SE paired per problem, as the peers' own metrics.jsonl say it is; in report.md's headline table and
    the swarm's live lines. Alone ran first (so the live table could show the gain as the swarm went)."""
    res, out = demo_out["res"], demo_out["out"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert set(report["gain_over_alone"]) == set(PEERS)
    md = (out / "report.md").read_text()
    assert md.index("## Gain over alone") < md.index("| peer | arm | rounds |")
    assert "on the 1200 held-out problems" in md and "paired per problem" in md
    for peer, mix in zip(PEERS, ("add", "sub", "signed"), strict=True):
        s, a = (_end_eval(out / arm / peer / "metrics.jsonl") for arm in ("swarm", "alone"))
        assert s["round"] == a["round"] == 2 and s["eval_n"] == a["eval_n"] == 1200 == len(s["eval_hits"])
        d = np.array([int(x) - int(y) for x, y in zip(s["eval_hits"], a["eval_hits"], strict=True)])
        g = report["gain_over_alone"][peer]
        assert g["paired"] and g["gain"] == pytest.approx(s["eval_accuracy"] - a["eval_accuracy"]) == \
            pytest.approx(d.mean())
        assert g["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(d.size)) and g["verdict"] == verdict(g["gain"], g["se"])
        assert {k for k, w in report["arms"]["swarm"][peer]["task_mix"].items() if w > 0} == {mix}
        row = next(line for line in md.splitlines() if line.startswith(f"| {peer} | {mix} | "))
        assert row.endswith(f"| {g['gain']:+.3f} +- {g['se']:.3f} | {g['verdict']} |"), row
        assert f"[demo] {peer:12s} gain over alone: {g['gain']:+.3f} +- {g['se']:.3f}" in res.stdout
    out_ = res.stdout
    alone_lines, swarm_lines = ([line for line in part.splitlines() if line.startswith("[demo] tiny-s r")] for part in (
        out_[out_.index("[demo] alone: started"):out_.index("[demo] swarm: started")],
        out_[out_.index("[demo] swarm: started"):out_.index("# swarm-node run report")]))
    assert alone_lines and not any(" gain " in line for line in alone_lines)  # the live lines: alone first
    assert swarm_lines and all(" gain " in line for line in swarm_lines)  # then the swarm's, with the gain column


def test_report_command_regenerates(demo_out):
    out = demo_out["out"]
    assert demo_out["res"].returncode == 0
    before = json.loads((out / "report.json").read_text())
    for name in ("report.md", "reward.png", "accuracy.png"):
        (out / name).unlink()
    res = _cli("report", str(out), presets=Path("/nonexistent"), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| tiny-m | swarm |" in res.stdout
    _check_pngs(out)
    again = json.loads((out / "report.json").read_text())
    assert again["command"] == before["command"] and again["arms"] == before["arms"]  # run info kept
    (out / "report.json").unlink()  # from the metrics files alone
    res = _cli("report", str(out), presets=Path("/nonexistent"), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "report.json").read_text())["arms"] == before["arms"]
    assert (out / "report.md").is_file()
    _check_pngs(out)


def test_report_on_empty_dir_is_a_clean_error(tmp_path):
    res = subprocess.run([sys.executable, "-m", "swarm_node.cli", "report", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "no metrics.jsonl" in res.stderr and "Traceback" not in res.stderr
