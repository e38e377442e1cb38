"""`swarm-node status`: list the live members of a swarm (read-only: it registers nothing)."""

from __future__ import annotations

import argparse
import json
import time

NAME = "status"
HELP = "list live peers of a swarm (from their signed membership heartbeats)"
DEFAULT_SWARMS = ("default", "demo")  # swarm.swarm_id's default, and the id `swarm-node demo` and peers/*.yaml use


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--initial-peers", nargs="+", required=True, help="bootstrap multiaddrs")
    p.add_argument("--swarm", default=None,
                   help=f"swarm id (default: look at both {' and '.join(repr(s) for s in DEFAULT_SWARMS)}, "
                   "the config default and the demo's)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--retries", type=int, default=2, help="join attempts after the first")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds per join attempt")


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands import _preflight as check
    from swarm_node.config import SwarmConfig
    from swarm_node.swarm.dht import ensure_identity, kill_dht, start_dht
    from swarm_node.swarm.records import (
        MemberRecord,
        load_identity_key,
        make_validators,
        members_key,
        parse_signed,
    )

    check.peer_addresses(args.initial_peers, "--initial-peers entry")
    swarm_ids = [args.swarm] if args.swarm else list(DEFAULT_SWARMS)
    cfg = SwarmConfig(
        enabled=True, swarm_id=swarm_ids[0], initial_peers=list(args.initial_peers),
        host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True, bootstrap_retries=max(args.retries, 0),
        bootstrap_timeout_s=args.timeout,
    )
    identity, tmp, _ = ensure_identity(None)
    key = load_identity_key(identity)
    # signature validation is the same for every swarm; shapes are checked again by parse_signed per swarm
    try:
        dht = start_dht(cfg, identity, make_validators(cfg.swarm_id, key), check_identity=False)
    except BaseException:
        tmp.cleanup()
        raise
    found: dict[str, list] = {}
    try:
        for sid in swarm_ids:
            value = dht.get(members_key(sid), latest=True)
            members, _problems = parse_signed(value.value if value is not None else None, MemberRecord)
            found[sid] = sorted(members.values(), key=lambda m: m.peer_id)
    finally:
        kill_dht(dht)
        tmp.cleanup()
    if args.json:
        print(json.dumps([{"swarm_id": sid, **m.model_dump()} for sid, rows in found.items() for m in rows], indent=2))
        return 0
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
    return 0
