"""The arguments every benchmark takes, and its JSON output.

`--quick` picks the benchmark's smoke size, `--seeds N` how many seeds (an explicit value wins over the
quick default), `--seed S` the first one, and `--json PATH` where the results go; the JSON records the
command, seeds, date and machine beside them, as CONTRIBUTING.md asks of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any


def add_run_args(ap: argparse.ArgumentParser, *, seeds: int, quick: str, quick_seeds: int | None = None,
                 first_seed: int = 0, seeds_help: str = "how many seeds, from --seed on") -> None:
    """--quick, --seeds, --seed and --json, with this benchmark's defaults written into their help."""
    quick_seeds = seeds if quick_seeds is None else quick_seeds
    ap.add_argument("--quick", action="store_true", help=f"smoke size: {quick}")
    ap.add_argument("--seeds", type=int, default=None,
                    help=f"{seeds_help} (default {seeds}; {quick_seeds} with --quick)")
    ap.add_argument("--seed", type=int, default=first_seed, help=f"first seed (default {first_seed})")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    ap.set_defaults(_default_seeds=seeds, _quick_seeds=quick_seeds)


def resolve_seeds(args: argparse.Namespace) -> list[int]:
    """The seeds to run, and `args.seeds` set to their count: an explicit --seeds, else the (quick) default."""
    if args.seeds is None:
        args.seeds = args._quick_seeds if args.quick else args._default_seeds
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    return list(range(args.seed, args.seed + args.seeds))


def public_args(args: argparse.Namespace, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """The parsed arguments as JSON-ready values (paths as strings), without the helpers' own entries."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if not k.startswith("_") and k not in drop}


def run_record(args: argparse.Namespace | None = None) -> dict[str, Any]:
    """How these results were made: the command line, the seeds, when, and on what machine."""
    record: dict[str, Any] = {
        "command": " ".join(["python -m", _module_name(), shlex.join(sys.argv[1:])]).strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
    }
    if args is not None and getattr(args, "seeds", None) is not None and hasattr(args, "seed"):
        record["seeds"] = list(range(args.seed, args.seed + args.seeds))
    return record


def write_json(path: Path | str | None, results: Any, args: argparse.Namespace | None = None) -> None:
    """Write `results` (a dict gets a "run" record added; anything else is wrapped as {"run", "results"})."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = run_record(args)
    doc = {"run": record, **results} if isinstance(results, dict) else {"run": record, "results": results}
    path.write_text(json.dumps(doc, indent=1, default=str))


def _module_name() -> str:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem
