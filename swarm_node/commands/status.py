"""`swarm-node status`: list the live members of a swarm (read-only: it registers nothing)."""

from __future__ import annotations

import argparse
import json
import time

NAME = "status"
HELP = "list live peers of a swarm (from their signed membership heartbeats)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--initial-peers", nargs="+", required=True, help="bootstrap multiaddrs")
    p.add_argument("--swarm", default="default", help="swarm id")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--retries", type=int, default=2, help="join attempts after the first")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds per join attempt")


def run(args: argparse.Namespace) -> int:
    from swarm_node.config import SwarmConfig
    from swarm_node.swarm.dht import ensure_identity, kill_dht, start_dht
    from swarm_node.swarm.records import (
        MemberRecord,
        load_identity_key,
        make_validators,
        members_key,
        parse_signed,
    )

    cfg = SwarmConfig(
        enabled=True, swarm_id=args.swarm, initial_peers=list(args.initial_peers), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        client_mode=True, bootstrap_retries=max(args.retries, 0), bootstrap_timeout_s=args.timeout,
    )
    identity, tmp, _ = ensure_identity(None)
    try:
        dht = start_dht(cfg, identity, make_validators(cfg.swarm_id, load_identity_key(identity)), check_identity=False)
    except BaseException:
        tmp.cleanup()
        raise
    try:
        found = dht.get(members_key(cfg.swarm_id), latest=True)
        members, _problems = parse_signed(found.value if found is not None else None, MemberRecord)
    finally:
        kill_dht(dht)
        tmp.cleanup()
    rows = sorted(members.values(), key=lambda m: m.peer_id)
    if args.json:
        print(json.dumps([m.model_dump() for m in rows], indent=2))
        return 0
    now = time.time()
    header = f"{'peer id':<48} {'mode':<5} {'model':<16} {'task':<12} {'round':>6} {'seen':>6}"
    print(f"swarm {cfg.swarm_id!r}: {len(rows)} live peer(s)")
    print(header)
    for m in rows:
        print(f"{m.peer_id:<48} {m.mode:<5} {m.model_name[:16]:<16} {m.task_id[:12]:<12} {m.round:>6} {now - m.updated:>5.0f}s")
    return 0
