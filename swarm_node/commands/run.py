"""`swarm-node run`: run a node (GRPO or DPO mode) until stopped or for cfg.rounds rounds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarm_node.config import NodeConfig

NAME = "run"
HELP = "run a node daemon (GRPO or DPO mode, per the config)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML config file (default: built-in defaults)")
    p.add_argument("--state-dir", type=Path, default=Path("runs/node"), help="checkpoints + metrics.jsonl")
    p.add_argument("--initial-peers", nargs="*", default=None, help="bootstrap multiaddrs (enables the swarm)")
    p.add_argument("--initial-peers-file", type=Path, default=None,
                   help="read bootstrap multiaddrs from this file (one per line; waits up to 120 s for it to appear)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set training.lr=1e-4 (repeatable; wins over the file and "
                   "SWARM_NODE__SECTION__KEY environment variables)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (on 127.0.0.1 unless metrics.prometheus_host is set)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands import _preflight as check
    from swarm_node.config import load_config

    overrides = list(args.overrides)
    if args.initial_peers_file is not None:
        args.initial_peers = list(args.initial_peers or []) + check.read_peers_file(args.initial_peers_file, 120.0)
    if args.initial_peers is not None:
        overrides.append("swarm.enabled=true")
        overrides.append("swarm.initial_peers=" + repr(list(args.initial_peers)).replace("'", '"'))
    if args.metrics_port is not None:
        overrides.append(f"metrics.prometheus_port={args.metrics_port}")
    cfg = load_config(args.config, overrides)
    args.state_dir = preflight(cfg, args.state_dir)
    if cfg.threads is not None:  # before any model code runs; wins over OMP_NUM_THREADS (the demo's default 1)
        import torch

        torch.set_num_threads(cfg.threads)
    if cfg.mode == "dpo":
        from swarm_node.dpo.round import run_dpo_node

        return run_dpo_node(cfg, args.state_dir, log_level=args.log_level)
    from swarm_node.grpo.round import run_grpo_node

    return run_grpo_node(cfg, args.state_dir, log_level=args.log_level)


def preflight(cfg: NodeConfig, state_dir: Path) -> Path:
    """Everything that can be checked before the model loads, so a mistake costs one line and no wait."""
    from swarm_node.commands import _preflight as check
    from swarm_node.node.trackers import check_installed

    state_dir = check.writable_dir(state_dir, "--state-dir")
    m = cfg.metrics
    if m.prometheus_port:
        check.port_free(m.prometheus_port, m.prometheus_host, "metrics.prometheus_port (--metrics-port)")
    check_installed(m.report_to)
    if cfg.mode == "grpo":
        from swarm_node.tasks import check_mix

        check_mix(cfg.task)
    if cfg.swarm.enabled:
        check.peer_addresses(cfg.swarm.initial_peers, "swarm.initial_peers entry")
        check.listen_ports_free(cfg.swarm.host_maddrs, "swarm.host_maddrs")
        check.identity_private(cfg.swarm.identity_path)
        check.lock_identity(cfg.swarm.identity_path)
    return state_dir
