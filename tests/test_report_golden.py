"""report.json and report.md stay byte-for-byte what they were before the dashboard shared their numbers.

tests/data/report_golden/<case>/ are run dirs (a real 2-peer demo with its alone arm, a synthetic demo dir
with a peer that has no rows yet, a GRPO node's state dir with a line cut short, a DPO node's, and
`specialised`: the metrics of a real default demo, 2026-12-07, whose report.md headline is README's first
table); the
<case>.report.json / .report.md beside them were written by the report code as it was before the
refactor (commit 696d22a), except the "Rejections by reason" table the reason registry added to report.md,
the specialties' per-part keys and gain-over-alone column (2026-12-02) and the "Gain over alone" table at the
top of report.md (2026-12-07). The dashboard's page shows the same per-peer numbers (one function).

When the report's format changes on purpose, regenerate a case's expected files from its run dir with the new
code and read the diff: copy tests/data/report_golden/<case> to a temp dir, call
`write_report(dir, {"command": "swarm-node demo (golden)", "rounds": 8})` and copy its report.md (and
report.json, less its "run_dir") over <case>.report.md / .json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from swarm_node.dashboard.data import RunWatcher
from swarm_node.runs.report import write_report

DATA = Path(__file__).resolve().parent / "data" / "report_golden"
CASES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
EXTRA = {"command": "swarm-node demo (golden)", "rounds": 8}  # what the expected files were written with


@pytest.mark.parametrize("case", CASES)
def test_report_output_is_unchanged(case, tmp_path):
    run = tmp_path / case
    shutil.copytree(DATA / case, run)
    write_report(run, dict(EXTRA))
    written = json.loads((run / "report.json").read_text())
    assert written.pop("run_dir") == str(run)
    assert written == json.loads((DATA / f"{case}.report.json").read_text())
    assert (run / "report.md").read_text() == (DATA / f"{case}.report.md").read_text()


@pytest.mark.parametrize("case", CASES)
def test_page_shows_the_reports_numbers(case):
    expected = json.loads((DATA / f"{case}.report.json").read_text())["arms"]
    doc = json.loads(RunWatcher([DATA / case]).document())
    page = {(p["arm"], p["name"]): p["summary"] for p in doc["peers"]}
    assert page == {(arm, peer): s for arm, peers in expected.items() for peer, s in peers.items()}


def test_the_readmes_first_figure_is_the_recorded_default_demos_table():
    """README's first table is the report.md headline of the run recorded in report_golden/specialised (the
    default demo), row for row: regenerate both together."""
    readme = (DATA.parents[2] / "README.md").read_text()
    first = readme.split("\n| peer |", 1)[1].split("\n\n", 1)[0].splitlines()
    report = (DATA / "specialised.report.md").read_text()
    assert len(first) == 5 and first[0].startswith(" samples | alone: acc start -> end |"), first
    assert "| peer |" + "\n".join(first) in report
