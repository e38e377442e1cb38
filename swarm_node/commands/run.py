"""`swarm-node run`: run a node (GRPO or DPO mode) until stopped or for cfg.rounds rounds."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "run"
HELP = "run a node daemon (GRPO or DPO mode, per the config)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML config file (default: built-in defaults)")
    p.add_argument("--state-dir", type=Path, default=Path("runs/node"), help="checkpoints + metrics.jsonl")
    p.add_argument("--initial-peers", nargs="*", default=None, help="bootstrap multiaddrs (enables the swarm)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set training.lr=1e-4 (repeatable)")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    from swarm_node.config import load_config

    overrides = list(args.overrides)
    if args.initial_peers is not None:
        overrides.append("swarm.enabled=true")
        overrides.append("swarm.initial_peers=" + repr(list(args.initial_peers)).replace("'", '"'))
    if args.metrics_port is not None:
        overrides.append(f"metrics.prometheus_port={args.metrics_port}")
    cfg = load_config(args.config, overrides)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    if cfg.mode == "dpo":
        from swarm_node.node.dpo_node import run_dpo_node

        return run_dpo_node(cfg, args.state_dir, log_level=args.log_level)
    from swarm_node.node.grpo_node import run_grpo_node

    return run_grpo_node(cfg, args.state_dir, log_level=args.log_level)
