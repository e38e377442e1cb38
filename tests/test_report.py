"""`swarm-node report DIR` on a node's state dir and on a demo dir; the reward plot's rolling mean and band."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from swarm_node.cli import main
from swarm_node.node.metrics import MetricsWriter
from swarm_node.runs.report import load_run, rolling


def grpo_rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = [{"round": 0, "reward_mean": None, "eval_accuracy": 0.2, "local_groups": 0, "external_groups": 0,
             "filtered": 0}]
    for r in range(1, n + 1):
        rows.append({"round": r, "reward_mean": float(rng.uniform(0, 1)), "loss": 0.1, "local_groups": 4,
                     "external_groups": 2, "filtered": 1, "bytes_out": 1000, "bytes_in": 2000,
                     "rejected": {"stale": 1} if r == 3 else {},
                     "eval_accuracy": 0.2 + 0.01 * r if r % 5 == 0 else None})
    return rows


def write_rows(state_dir: Path, rows: list[dict]) -> None:
    w = MetricsWriter(state_dir)
    for row in rows:
        w.write(row)


def test_report_on_a_single_node_state_dir(tmp_path, capsys):
    state = tmp_path / "me"
    write_rows(state, grpo_rows(12))
    (state / "ckpt-00000010").mkdir()  # what else a state dir holds does not matter
    assert main(["report", str(state)]) == 0
    for name in ("report.md", "report.json", "reward.png", "accuracy.png"):
        assert (state / name).is_file() and (state / name).stat().st_size > 0, name
    report = json.loads((state / "report.json").read_text())
    s = report["arms"]["node"]["me"]
    assert s["rounds"] == 12 and s["start_accuracy"] == 0.2 and s["end_accuracy"] == pytest.approx(0.3)
    assert s["external_groups"] == 24 and s["rejected"] == {"stale": 1} and s["bytes_out"] == 12000
    assert "| me | node | 12 |" in capsys.readouterr().out


def test_report_lists_rejections_with_their_meaning_from_the_registry(tmp_path):
    rows = grpo_rows(4)  # round 3 of these old-style rows counted `stale`, a reason gone from the registry
    rows[2]["rejected"] = {"task_mismatch": 2, "protocol:schema": 1}
    rows[4]["rejected"] = {"task_mismatch": 1, "params:not_finite": 1}
    write_rows(tmp_path / "me", rows)
    assert main(["report", str(tmp_path / "me")]) == 0
    md = (tmp_path / "me" / "report.md").read_text()
    table = md[md.index("## Rejections by reason"):]
    assert "| `task_mismatch` | 3 | batch of another task |" in table  # most frequent first
    assert table.index("task_mismatch") < table.index("protocol:schema")
    assert "| `protocol:schema` | 1 | the wire decoder refused the batch (schema) |" in table
    assert "| `params:not_finite` | 1 | a DPO parameter payload was refused: NaN or inf in a tensor |" in table
    assert "| `stale` | 1 | not a reason of this version |" in table
    write_rows(tmp_path / "clean", grpo_rows(4)[:3])
    assert main(["report", str(tmp_path / "clean")]) == 0
    assert "Rejections by reason" not in (tmp_path / "clean" / "report.md").read_text()


def test_report_on_a_dpo_state_dir(tmp_path):
    rows = [{"round": r, "dpo_loss": 0.7 - 0.01 * r, "train_pref_acc": 0.5 + 0.02 * r, "bytes_sent": 10,
             "bytes_received": 20, "heldout_pref_acc": 0.5 + 0.03 * r if r % 2 == 0 else None} for r in range(6)]
    write_rows(tmp_path / "dpo", rows)
    assert main(["report", str(tmp_path / "dpo")]) == 0
    s = json.loads((tmp_path / "dpo" / "report.json").read_text())["arms"]["node"]["dpo"]
    assert s["start_accuracy"] == 0.5 and s["end_accuracy"] == pytest.approx(0.62) and s["bytes_in"] == 120


def test_report_on_a_demo_dir_as_before(tmp_path):
    for arm in ("swarm", "alone"):
        for i, peer in enumerate(("tiny-s", "tiny-m")):
            write_rows(tmp_path / arm / peer, grpo_rows(10, seed=i))
    assert main(["report", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["arms"]) == {"swarm", "alone"} and set(report["arms"]["swarm"]) == {"tiny-s", "tiny-m"}
    assert (tmp_path / "reward.png").is_file() and (tmp_path / "accuracy.png").is_file()
    assert set(load_run(tmp_path)) == {"swarm", "alone"}


def test_report_on_a_dir_without_metrics_says_what_it_expects(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no metrics.jsonl with rows in" in err and "(a node's --state-dir)" in err and "swarm-node demo --out" in err


def test_rolling_mean_and_band():
    mean, std = rolling([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0], k=4)
    assert mean.tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.5, 0.5, 0.5, 0.75])
    assert std[0] == 0 and std[3] == pytest.approx(0.5) and std[-1] == pytest.approx(np.std([0, 1, 1, 1]))
    assert len(mean) == len(std) == 7  # one value per round: plotted on the same rounds as the raw rewards


@pytest.mark.slow
def test_report_on_a_real_run_state_dir(presets_dir, tmp_path):
    """`swarm-node run` then `swarm-node report` on its state dir, as a user of a single node would."""
    state = tmp_path / "runs" / "me"
    run = subprocess.run([sys.executable, "-m", "swarm_node.cli", "run", "--state-dir", str(state), "--set", "rounds=3",
                          "--set", "task.eval_n=8", "--set", "metrics.eval_every=2", "--log-level", "warning"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rep = subprocess.run([sys.executable, "-m", "swarm_node.cli", "report", str(state)], capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert (state / "reward.png").is_file() and (state / "accuracy.png").is_file()
    assert json.loads((state / "report.json").read_text())["arms"]["node"]["me"]["rounds"] == 3


def part_rows(n: int, acc: dict[str, float], gain: dict[str, float], hits: str, mix: dict) -> list[dict]:
    """GRPO rows of a task with parts: eval every 5 rounds, per part, with the final eval's hits."""
    rows = grpo_rows(n)
    rows[0].update(eval_acc_parts=dict(acc), eval_n_parts={k: 4 for k in acc}, task_mix=mix, eval_n=len(hits))
    for r in rows[1:]:
        if r["eval_accuracy"] is not None:
            r["eval_acc_parts"] = {k: v + gain[k] * r["round"] / n for k, v in acc.items()}
            r["eval_n_parts"] = {k: 4 for k in acc}
            r["eval_n"] = len(hits)
            r["eval_hits"] = hits
            r["eval_accuracy"] = hits.count("1") / len(hits)
    return rows


def test_report_per_part_and_gain_over_alone(tmp_path):
    """A demo dir whose task has parts: a per-part table and plot, and the swarm's gain over alone with its
    paired SE (the same 12 problems; the swarm gets 4 more right and 1 fewer)."""
    acc = {"add": 0.25, "sub": 0.25, "signed": 0.0}
    alone = "110000110000"
    swarm = "111101010001"  # 4 more right, 1 fewer: gain 3/12
    write_rows(tmp_path / "alone" / "tiny-s", part_rows(10, acc, {"add": 0.2, "sub": 0, "signed": 0}, alone,
                                                        {"add": 1.0, "sub": 0.0, "signed": 0.0}))
    write_rows(tmp_path / "swarm" / "tiny-s", part_rows(10, acc, {"add": 0.2, "sub": 0.1, "signed": 0.3}, swarm,
                                                        {"add": 1.0, "sub": 0.0, "signed": 0.0}))
    assert main(["report", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    g = report["gain_over_alone"]["tiny-s"]
    d = np.array([int(a) - int(b) for a, b in zip(swarm, alone, strict=True)])
    assert g["paired"] and g["gain"] == pytest.approx(3 / 12)
    assert g["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(12)) and g["verdict"] == "cannot tell"
    s = report["arms"]["swarm"]["tiny-s"]
    assert s["end_accuracy_parts"] == pytest.approx({"add": 0.45, "sub": 0.35, "signed": 0.3})
    md = (tmp_path / "report.md").read_text()
    assert f"| +0.250 +- {g['se']:.3f} (cannot tell) |" in md and "gain over alone" in md
    assert "| tiny-s | swarm | add | 0.250 -> 0.450 | 0.250 -> 0.350 | 0.000 -> 0.300 |" in md, md
    # the headline, first thing after the command: the alone and swarm ends and the gain, paired, on 12 problems
    headline = md.index("## Gain over alone")
    assert headline < md.index("| peer | arm | rounds |") and "on the 12 held-out problems" in md
    assert (f"| tiny-s | add | {s['start_accuracy']:.3f} -> {4 / 12:.3f} | {s['start_accuracy']:.3f} -> {7 / 12:.3f} "
            f"| +0.250 +- {g['se']:.3f} | cannot tell |") in md, md
    assert (tmp_path / "accuracy_parts.png").stat().st_size > 0


def test_the_default_demos_report_carries_each_peers_gain_over_alone(tmp_path):
    """The recorded metrics of a real default demo (tests/data/report_golden/specialised: 3 specialised peers,
    60 rounds, 1200 eval problems) through the report code: every peer's gain over alone and its SE, paired
    per problem, as the final eval rows' hits give them, in report.json and report.md's headline table."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "data" / "report_golden" / "specialised", run)
    assert main(["report", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    md = (run / "report.md").read_text()
    assert set(report["gain_over_alone"]) == {"tiny-s", "tiny-m", "tiny-s-lora"}
    for peer, g in report["gain_over_alone"].items():
        ends = [[r for r in map(json.loads, (run / arm / peer / "metrics.jsonl").read_text().splitlines())
                 if r.get("eval_hits")][-1] for arm in ("swarm", "alone")]
        assert ends[0]["round"] == ends[1]["round"] == 60 and len(ends[0]["eval_hits"]) == 1200
        d = np.array([int(x) - int(y) for x, y in zip(ends[0]["eval_hits"], ends[1]["eval_hits"], strict=True)])
        assert g["paired"] and g["gain"] == pytest.approx(d.mean())
        assert g["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(1200)) and 0.005 < g["se"] < 0.02
        mix = next(k for k, w in report["arms"]["swarm"][peer]["task_mix"].items() if w > 0)
        assert f"| {peer} | {mix} | " in md and f"| {g['gain']:+.3f} +- {g['se']:.3f} | {g['verdict']} |" in md
