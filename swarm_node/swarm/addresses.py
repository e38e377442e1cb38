"""The network missteps a user makes, each said in one line with what to do.

An unreachable bootstrap fails the start (swarm.dht.start_dht names the addresses it tried). The others
do not fail anything at once, they only leave the node unheard, so they are told as warnings:
- at start, from the config alone (`config_warnings`): an announced address on a port nothing listens
  on, or a private address announced to a public swarm;
- while running (`unreachable_warning`): peers in the view that every push has failed to reach for a
  while, which is what two peers behind NATs see without a relay between them.
Also the multiaddr reading these need (`components`), and `pin_ports`, which keeps a restarted DHT child
on the addresses its peers know.
"""

from __future__ import annotations

import ipaddress

from swarm_node.config import SwarmConfig

BEHIND_NAT = 'docs/operations.md, "Behind NAT"'


def components(maddr: str) -> dict[str, str]:
    """Protocol -> value of a multiaddr's leading pairs: /ip4/1.2.3.4/tcp/31337 -> {ip4: 1.2.3.4, tcp: 31337}."""
    parts = [p for p in maddr.split("/") if p]
    return {parts[i]: parts[i + 1] for i in range(0, len(parts) - 1, 2)}


def _parts(maddr: str) -> tuple[str | None, str | None]:
    """(ip, tcp port) of a multiaddr like /ip4/1.2.3.4/tcp/31337[/p2p/...]; None where absent."""
    c = components(maddr)
    return c.get("ip4") or c.get("ip6"), c.get("tcp")


def _is_private(ip: str | None) -> bool:
    try:
        addr = ipaddress.ip_address(ip or "")
    except ValueError:
        return False
    return addr.is_private or addr.is_loopback or addr.is_link_local or addr in ipaddress.ip_network("100.64.0.0/10")


def pin_ports(host_maddrs: list[str], visible_maddrs: list[str]) -> list[str]:
    """host_maddrs with each port 0 replaced by the port the DHT child was given for that transport.

    A restarted child listens where the dead one did, so the addresses peers hold for us (in their
    routing tables and p2pd peerstores, or as their initial peers) stay right. A transport seen on
    several ports (or none) keeps its 0.
    """
    seen: dict[str, set[str]] = {}
    for m in visible_maddrs:
        for proto, port in components(m).items():
            if proto in ("tcp", "udp"):
                seen.setdefault(proto, set()).add(port)
    out = []
    for m in host_maddrs:
        c = components(m)
        for proto in ("tcp", "udp"):
            if c.get(proto) == "0" and len(seen.get(proto, ())) == 1:
                m = m.replace(f"/{proto}/0", f"/{proto}/{next(iter(seen[proto]))}", 1)
        out.append(m)
    return out


def config_warnings(cfg: SwarmConfig) -> list[str]:
    """One line per announce address that peers cannot reach, judged from the config."""
    out = []
    listen_ports = {_parts(m)[1] for m in cfg.host_maddrs}
    public_peers = [m for m in cfg.initial_peers if _parts(m)[0] and not _is_private(_parts(m)[0])]
    for m in cfg.announce_maddrs:
        ip, port = _parts(m)
        if port is not None and "0" in listen_ports and port not in listen_ports:
            out.append(f"swarm.announce_maddrs names {m}, but swarm.host_maddrs listens on a random port (tcp/0), "
                       f"so nothing answers at {port}: listen on it (host_maddrs: [/ip4/0.0.0.0/tcp/{port}]) "
                       f"and forward that port to this machine ({BEHIND_NAT})")
        if _is_private(ip) and public_peers:
            out.append(f"swarm.announce_maddrs names {m}, a private address, while the initial peers are public "
                       f"(e.g. {public_peers[0]}): peers outside this network cannot reach it; announce your "
                       f"public address and forward its port, or drop announce_maddrs and set "
                       f"swarm.use_auto_relay: true ({BEHIND_NAT})")
    return out


def unreachable_warning(cfg: SwarmConfig, peers: list[str], for_s: float) -> str:
    """The line for peers that every push has failed to reach for `for_s` seconds."""
    head = (f"{len(peers)} peer(s) unreachable from here for {for_s:.0f}s or more (every push to them failed, "
            f"e.g. {peers[0]})")
    if not cfg.use_auto_relay:
        return (f"{head}: if this node and they are behind NATs, set swarm.use_auto_relay: true on both, with "
                f"public bootstraps that relay ({BEHIND_NAT})")
    return (f"{head}: peers behind NATs reach each other only through a relay on a public peer, and autorelay "
            f"waits for 4 candidates: list 4 or more public bootstraps in swarm.initial_peers ({BEHIND_NAT})")
