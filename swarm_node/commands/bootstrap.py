"""`swarm-node bootstrap`: a DHT-only peer that others join through; prints its multiaddrs, then serves."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

NAME = "bootstrap"
HELP = "run a DHT-only bootstrap peer (prints its multiaddrs, serves until SIGINT/SIGTERM)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/0"],
                   help="listen multiaddrs, e.g. /ip4/0.0.0.0/tcp/31337 (fix the port for a public peer)")
    p.add_argument("--announce-maddrs", nargs="*", default=[], help="public multiaddrs to announce (explicit port)")
    p.add_argument("--identity", default=None, help="identity (private key) file; created if missing; keeps the peer id")
    p.add_argument("--initial-peers", nargs="*", default=[], help="other bootstrap peers to join (optional)")
    p.add_argument("--swarm", nargs="+", default=["default"],
                   help="swarm id(s) whose keys must hold signed records; signed records of any swarm are "
                        "shape-checked, and every record is bounded in size and lifetime (docs/security.md)")
    p.add_argument("--no-relay", action="store_true", help="disable libp2p circuit relay")
    p.add_argument("--maddrs-file", default=None,
                   help="also write the visible multiaddrs to this file (peers read it with --initial-peers-file)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace) -> int:
    from swarm_node.commands import _preflight as check
    from swarm_node.config import SwarmConfig
    from swarm_node.swarm.dht import ensure_identity, kill_dht, record_refusals, start_dht
    from swarm_node.swarm.records import load_identity_key, make_validators

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("swarm_node.bootstrap")
    cfg = SwarmConfig(
        enabled=True, swarm_id=args.swarm[0], initial_peers=list(args.initial_peers), host_maddrs=list(args.host_maddrs),
        announce_maddrs=list(args.announce_maddrs), identity_path=args.identity, use_relay=not args.no_relay,
    )
    check.peer_addresses(cfg.initial_peers, "--initial-peers entry")
    check.listen_ports_free(cfg.host_maddrs, "--host-maddrs")
    check.identity_private(cfg.identity_path)
    check.lock_identity(cfg.identity_path)
    if args.maddrs_file:
        check.writable_dir(Path(args.maddrs_file).expanduser().parent, "--maddrs-file directory")
    identity, tmp, created = ensure_identity(cfg.identity_path)
    validators = make_validators(list(args.swarm), load_identity_key(identity))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    dht = start_dht(cfg, identity, validators, check_identity=not created, logger=log)
    try:
        maddrs = [str(m) for m in dht.get_visible_maddrs()]
        for maddr in maddrs:
            print(maddr, flush=True)
        if args.maddrs_file:
            out = Path(args.maddrs_file)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp_file = out.with_suffix(out.suffix + ".tmp")
            tmp_file.write_text("".join(m + "\n" for m in maddrs))
            tmp_file.replace(out)  # atomic: a reader never sees half a file
        refused, ticks = {}, 0
        while not stop.wait(1.0):
            if not dht.is_alive():  # supervise: same identity, so the printed addresses stay valid
                log.warning("DHT child died (exit code %s); restarting", dht.exitcode)
                kill_dht(dht)
                dht = start_dht(cfg, identity, validators, check_identity=False, logger=log)
            ticks += 1
            if ticks % 60 == 0:  # records peers tried to make us store and we refused, by reason
                try:
                    now = record_refusals(dht)
                except Exception:
                    continue
                if now != refused:
                    refused = now
                    log.warning("DHT records refused since the DHT child started: %s", refused)
    finally:
        kill_dht(dht)
        if tmp is not None:
            tmp.cleanup()
    print("bootstrap peer stopped", file=sys.stderr, flush=True)
    return 0
