"""The `swarm-node` command.

Every subcommand lives in its own module under `swarm_node/commands/` and exposes `NAME`, `HELP`,
`add_arguments(parser)` and `run(args) -> int`; this file only discovers and dispatches them, so adding a
command never touches this file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from swarm_node import __version__, commands


def _command_modules() -> list:
    mods = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"swarm_node.commands.{info.name}"))
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm-node",
        description="Decentralized peer-to-peer RL post-training of language models.",
    )
    parser.add_argument("--version", action="version", version=f"swarm-node {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def quiet_libraries() -> None:
    """No tqdm bars from transformers / huggingface_hub ("Loading weights ...") in any command's output.

    Set before any command imports transformers (it reads the switch at import); a user who wants the bars
    back sets HF_HUB_DISABLE_PROGRESS_BARS=0. Child processes (demo peers) inherit it.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported already (in-process callers): switch it off there too
        from transformers.utils import logging as hf_logging

        if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "0":
            hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except UserFacingError as exc:  # clean message, no traceback
        print(f"swarm-node {args.command}: error: {exc}", file=sys.stderr)
        return 2


from swarm_node.errors import UserFacingError  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
