"""`swarm-node status`: list the live members of a swarm (read-only: it registers nothing).

With --wait-for N it keeps looking (one join, a DHT read every POLL_S) until N members are live at once, so a
script or a container started beside the swarm needs no sleep that guesses how fast the machine is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from swarm_node.dashboard.swarm_view import DEFAULT_SWARMS  # the same swarms the dashboard's swarm view reads

NAME = "status"
HELP = "list live peers of a swarm (from their signed membership heartbeats)"
POLL_S = 2.0  # between membership reads while waiting (a read is one small DHT lookup)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--initial-peers", nargs="+", default=None, help="bootstrap multiaddrs")
    p.add_argument("--initial-peers-file", type=Path, default=None,
                   help="read bootstrap multiaddrs from this file (what `swarm-node bootstrap --maddrs-file` writes); "
                   "waits up to --wait-s for it to appear")
    p.add_argument("--swarm", default=None,
                   help=f"swarm id (default: look at both {' and '.join(repr(s) for s in DEFAULT_SWARMS)}, "
                   "the config default and the demo's)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--retries", type=int, default=2, help="join attempts after the first")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds per join attempt")
    p.add_argument("--wait-for", type=int, default=0, metavar="N",
                   help="keep looking until at least N peers are live at once (counted over the swarms looked at), "
                   "up to --wait-s; exit status 1 if fewer by then (default 0: look once)")
    p.add_argument("--wait-s", type=float, default=300.0,
                   help="how long --initial-peers-file and --wait-for wait, together (default 300)")


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands import _preflight as check
    from swarm_node.dashboard.swarm_view import SwarmReader
    from swarm_node.errors import UserFacingError

    if args.wait_for < 0 or args.wait_s < 0:
        raise UserFacingError("--wait-for and --wait-s take a count / seconds >= 0")
    deadline = time.monotonic() + args.wait_s
    peers = list(args.initial_peers or [])
    if args.initial_peers_file is not None:
        peers += check.read_peers_file(args.initial_peers_file, args.wait_s)
    if not peers:
        raise UserFacingError("status needs the bootstrap's address: --initial-peers MULTIADDR... or "
                              "--initial-peers-file FILE (what `swarm-node bootstrap --maddrs-file` writes)")
    check.peer_addresses(peers, "--initial-peers entry")

    swarm_ids = [args.swarm] if args.swarm else list(DEFAULT_SWARMS)
    # hivemind (and torch under it) only once the arguments are known to be good: a mistake costs no wait
    reader = SwarmReader(peers, swarm_ids, retries=args.retries, timeout_s=args.timeout)
    try:
        found = reader.members()
        said = -1
        while (live := sum(map(len, found.values()))) < args.wait_for and time.monotonic() < deadline:
            if live != said:
                print(f"status: {live} of {args.wait_for} peers live; looking again every {POLL_S:.0f}s for up "
                      f"to {deadline - time.monotonic():.0f}s more", file=sys.stderr, flush=True)
                said = live
            time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
            found = reader.members()
    finally:
        reader.close()
    live = sum(map(len, found.values()))
    short = live < args.wait_for
    if short:
        print(f"status: only {live} of {args.wait_for} peers live after waiting {args.wait_s:.0f}s",
              file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([{"swarm_id": sid, **m.model_dump()} for sid, rows in found.items() for m in rows], indent=2))
        return 1 if short else 0
    now = time.time()
    header = f"{'peer id':<48} {'mode':<5} {'model':<16} {'task':<12} {'round':>6} {'seen':>6}"
    for sid, rows in found.items():
        if not rows and len(found) > 1:
            print(f"swarm {sid!r}: 0 live peers")
            continue
        print(f"swarm {sid!r}: {len(rows)} live peer(s)")
        if not rows:
            print("  (peers of other swarms are invisible: check swarm.swarm_id in their config)")
            continue
        print(header)
        for m in rows:
            print(f"{m.peer_id:<48} {m.mode:<5} {m.model_name[:16]:<16} {m.task_id[:12]:<12} {m.round:>6} "
                  f"{now - m.updated:>5.0f}s")
    if not args.swarm:
        print(f"(no --swarm given: looked at swarms {' and '.join(repr(s) for s in swarm_ids)}; "
              "pass --swarm ID for another)")
    return 1 if short else 0
