"""`swarm-node report RUN_DIR`: regenerate report.json, report.md and the plots from metrics.jsonl files."""

from __future__ import annotations

import argparse
from pathlib import Path

from swarm_node.errors import UserFacingError

NAME = "report"
HELP = "rebuild a run's report.json, report.md and PNG plots from its metrics.jsonl files"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a directory written by `swarm-node demo --out`")


def run(args: argparse.Namespace) -> int:
    from swarm_node.runs.report import write_report

    old = args.run_dir / "report.json"
    extra = {}
    if old.is_file():
        import json

        prev = json.loads(old.read_text())
        extra = {k: v for k, v in prev.items() if k not in ("arms", "run_dir")}
    try:
        write_report(args.run_dir, extra)
    except FileNotFoundError as exc:
        raise UserFacingError(str(exc)) from None
    print((args.run_dir / "report.md").read_text())
    return 0
