"""`swarm-node dashboard DIR [DIR ...]`: a live page of runs as they go, on 127.0.0.1.

DIR is a node's state dir (`swarm-node run --state-dir`) or a demo dir (`swarm-node demo --out`); a dir that
does not exist yet is waited for (the page says so). With `--initial-peers` the page also lists the swarm's
live members from the DHT, like `swarm-node status`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from swarm_node.errors import UserFacingError

NAME = "dashboard"
HELP = "serve a live page of node state dirs or demo dirs (and the swarm, with --initial-peers) on 127.0.0.1"
DEFAULT_PORT = 8470


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR",
                   help="a node's state dir (swarm-node run --state-dir) or a demo dir (swarm-node demo --out)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port on 127.0.0.1 (default: {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--initial-peers", nargs="+", default=None, metavar="MULTIADDR",
                   help="bootstrap multiaddrs: also show the swarm's live peers, their models and rounds")
    p.add_argument("--swarm", nargs="+", default=None, metavar="ID",
                   help="swarm ids to list (default: 'default' and 'demo', like swarm-node status)")


def run(args: argparse.Namespace) -> int:
    from swarm_node.dashboard.server import serve_dirs, stop

    for d in args.dirs:
        if d.exists() and not d.is_dir():
            raise UserFacingError(f"{str(d)!r} is a file; give the directory that holds metrics.jsonl "
                                  "(a node's --state-dir) or a demo dir")
    if not 0 <= args.port <= 65535:
        raise UserFacingError(f"--port {args.port}: give 0-65535")
    swarm = None
    if args.initial_peers:
        from swarm_node.commands import _preflight as check
        from swarm_node.dashboard.swarm_view import SwarmWatch

        check.peer_addresses(args.initial_peers, "--initial-peers entry")
        swarm = SwarmWatch(args.initial_peers, args.swarm)
    server, url = serve_dirs(args.dirs, args.port, what="swarm-node dashboard --port", swarm=swarm, warm_up=True)
    if swarm is not None:
        swarm.start()
    for d in args.dirs:
        if not d.exists():
            print(f"[dashboard] {d} does not exist yet: the page shows it once it does", flush=True)
    print(f"[dashboard] {url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stop(server)
        if swarm is not None:
            swarm.close()
    return 0
