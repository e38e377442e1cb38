"""`swarm-node launch`: one node per GPU of this machine, from one config.

A node owns one model on one device; a machine with several GPUs runs several nodes. Each child is a plain
`swarm-node run` with CUDA_VISIBLE_DEVICES set to its GPU (so it sees that GPU as cuda:0, where the vLLM
backend runs), its own state dir and identity under --state-root, and its own seed and model name, so the
children are distinct peers of one swarm. `--local-bootstrap` starts a bootstrap peer on 127.0.0.1 for them
(a machine that is its own swarm); otherwise they join --initial-peers or the config's. Ctrl-C or SIGTERM
stops every child (each checkpoints first); the exit code is the worst child's.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

NAME = "launch"
HELP = "run one node per GPU of this machine from one config (CUDA_VISIBLE_DEVICES, state dir, seed per GPU)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="the YAML config every node starts from")
    p.add_argument("--gpus", default="all",
                   help="comma-separated GPU indices, one node each (default: every GPU nvidia-smi lists)")
    p.add_argument("--state-root", type=Path, default=Path("runs/gpus"), help="gpu<N>/ under it per node")
    p.add_argument("--initial-peers", nargs="*", default=None, help="bootstrap multiaddrs of the swarm to join")
    p.add_argument("--local-bootstrap", action="store_true",
                   help="start a bootstrap peer on 127.0.0.1 and join the nodes through it")
    p.add_argument("--metrics-port", type=int, default=None, help="node i serves /metrics on this port + i")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for every node (as for `swarm-node run`)")


def gpu_indices(spec: str) -> list[str]:
    """'0,2' -> ['0', '2']; 'all' -> what nvidia-smi lists."""
    import subprocess

    from swarm_node.errors import UserFacingError

    if spec != "all":
        out = [g.strip() for g in spec.split(",") if g.strip()]
        if not out or not all(g.isdigit() for g in out) or len(set(out)) != len(out):
            raise UserFacingError(f"--gpus {spec!r}: expected distinct GPU indices like 0,1,2")
        return out
    try:
        lines = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        lines = []
    found = [str(i) for i, ln in enumerate(ln for ln in lines if ln.startswith("GPU "))]
    if not found:
        raise UserFacingError("--gpus all: nvidia-smi lists no GPU here; name the indices with --gpus 0,1")
    return found


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands import _preflight as check
    from swarm_node.config import load_config
    from swarm_node.runs.local_swarm import Peer, start_bootstrap, stop_processes, write_peer_config

    gpus = gpu_indices(args.gpus)
    cfg = load_config(args.config, args.overrides)  # refuse a bad config once, before any child starts
    root = check.writable_dir(args.state_root, "--state-root")
    peers_args: list[str] | None = args.initial_peers
    boot = None
    if args.local_bootstrap:
        boot = start_bootstrap(root / "bootstrap", cfg.swarm.swarm_id)
        peers_args = boot.maddrs
        print(f"[launch] bootstrap peer: {boot.maddrs[0]}", flush=True)
    name = cfg.model.name or Path(cfg.model.path).name
    peers = []
    for i, gpu in enumerate(gpus):
        state = root / f"gpu{gpu}"
        config = write_peer_config(args.config, state / "config.yaml", {
            "seed": cfg.seed + i, "model.name": f"{name}-gpu{gpu}",
            "swarm.identity_path": str(state / "identity.key")})
        own = ("seed=", "model.name=", "swarm.identity_path=")  # per node, in its config file
        extra = [x for o in args.overrides if not o.startswith(own) for x in ("--set", o)]
        if args.metrics_port is not None:
            extra += ["--metrics-port", str(args.metrics_port + i)]
        peer = Peer(f"gpu{gpu}", config, state, extra_args=extra, env={"CUDA_VISIBLE_DEVICES": gpu},
                    threads=cfg.threads or 4)
        peer.start(peers_args)
        peers.append(peer)
        print(f"[launch] node {peer.name}: CUDA_VISIBLE_DEVICES={gpu}, state {state}, log {peer.log_path}", flush=True)
    stopping = []
    handlers = {s: signal.signal(s, lambda *_: stopping.append(True)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopping and any(p.running() for p in peers):
            time.sleep(0.5)
    finally:
        codes = stop_processes([p.proc for p in peers])
        if boot is not None:
            boot.stop()
        for s, h in handlers.items():
            signal.signal(s, h)
    for peer, code in zip(peers, codes, strict=True):
        print(f"[launch] node {peer.name} exited with {code}", flush=True)
    if stopping:
        return 130
    return max((c or 0) for c in codes)
