"""`swarm-node report DIR`: (re)build report.json, report.md and the plots from metrics.jsonl files.

DIR is a node's state dir (`swarm-node run --state-dir`) or a demo's output dir (`swarm-node demo --out`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from swarm_node.errors import UserFacingError

NAME = "report"
HELP = "write report.json, report.md and PNG plots of a node's state dir or a demo dir, from metrics.jsonl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="DIR",
                   help="a node's state dir (swarm-node run --state-dir) or a demo dir (swarm-node demo --out)")


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands._preflight import writable_dir
    from swarm_node.runs.report import write_report

    if not args.run_dir.is_dir():
        raise UserFacingError(f"{str(args.run_dir)!r} is not a directory; give a node's state dir or a demo dir")
    writable_dir(args.run_dir, "report directory")

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
