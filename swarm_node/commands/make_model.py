"""`swarm-node make-model`: build a tiny offline preset (tiny-s, tiny-m) into a directory.

Presets are normally built on first use; this command builds one explicitly (another seed, another place)
so it can be inspected, copied to an offline machine, or passed as model.path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "make-model"
HELP = "build a tiny warmed-up preset model (tiny-s, tiny-m) into a directory"


# the names of swarm_node.models.factory.PRESETS, here so `--help` does not import torch (a test keeps them equal)
PRESET_NAMES = ("tiny-m", "tiny-s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", required=True, choices=PRESET_NAMES, help="which preset to build")
    p.add_argument("--out", type=Path, required=True, help="output directory (created; files are overwritten)")
    p.add_argument("--seed", type=int, default=0, help="seed for init and warm-up (same seed -> same weights)")
    p.add_argument("--json", action="store_true", help="print the metadata as one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands._preflight import writable_dir
    from swarm_node.errors import UserFacingError
    from swarm_node.models.factory import build_tiny

    out: Path = args.out.expanduser()
    if out.exists() and not out.is_dir():
        raise UserFacingError(f"--out {str(out)!r} exists and is not a directory; pick another path")
    writable_dir(out, "--out")
    # With --json, progress goes to stderr so stdout stays one parseable object.
    stream = sys.stderr if args.json else sys.stdout

    def progress(msg: str) -> None:
        print(msg, file=stream, flush=True)

    meta = build_tiny(args.preset, out, seed=args.seed, progress=progress)
    if args.json:
        print(json.dumps(meta, sort_keys=True))
    else:
        print(
            f"built {meta['preset']} ({meta['arch']}, seed {meta['seed']}): {meta['parameters']:,} parameters, "
            f"{meta['warmup_steps']} warm-up steps, train-split accuracy {meta['warmup_val_accuracy']:.2f}, "
            f"id eval accuracy {meta['eval_id_accuracy']:.2f}, {meta['build_seconds']:.1f} s -> {out}"
        )
    return 0
