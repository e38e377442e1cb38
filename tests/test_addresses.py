"""The network missteps a user makes are each told in one line that says what to do (swarm/addresses.py)."""

from __future__ import annotations

from swarm_node.config import SwarmConfig
from swarm_node.swarm.addresses import config_warnings, unreachable_warning

PUBLIC_BOOT = "/ip4/93.184.216.34/tcp/31337/p2p/QmBoot"  # (203.0.113/24 is private to ipaddress)


def _cfg(**kw) -> SwarmConfig:
    return SwarmConfig(enabled=True, **kw)


def test_an_announced_port_that_nothing_listens_on_is_told_with_the_fix():
    lines = config_warnings(_cfg(host_maddrs=["/ip4/0.0.0.0/tcp/0"], announce_maddrs=["/ip4/93.184.216.7/tcp/31337"],
                                 initial_peers=[PUBLIC_BOOT]))
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "random port (tcp/0)" in lines[0] and "host_maddrs: [/ip4/0.0.0.0/tcp/31337]" in lines[0]


def test_a_private_address_announced_to_a_public_swarm_is_told():
    lines = config_warnings(_cfg(host_maddrs=["/ip4/0.0.0.0/tcp/31337"], announce_maddrs=["/ip4/192.168.1.20/tcp/31337"],
                                 initial_peers=[PUBLIC_BOOT]))
    assert len(lines) == 1 and "private address" in lines[0] and "use_auto_relay: true" in lines[0]


def test_right_configs_say_nothing():
    assert config_warnings(_cfg()) == []  # the defaults: nothing announced
    assert config_warnings(_cfg(host_maddrs=["/ip4/0.0.0.0/tcp/31337"], announce_maddrs=["/ip4/93.184.216.7/tcp/31337"],
                                initial_peers=[PUBLIC_BOOT])) == []
    # a port forward to another local port is legitimate; so is a LAN-only swarm announcing LAN addresses
    assert config_warnings(_cfg(host_maddrs=["/ip4/0.0.0.0/tcp/41337"], announce_maddrs=["/ip4/93.184.216.7/tcp/31337"])) == []
    assert config_warnings(_cfg(host_maddrs=["/ip4/0.0.0.0/tcp/31337"], announce_maddrs=["/ip4/10.1.2.3/tcp/31337"],
                                initial_peers=["/ip4/10.1.2.4/tcp/31337/p2p/QmBoot"])) == []


def test_unreachable_peers_are_told_with_the_relay_setting_to_change():
    off = unreachable_warning(_cfg(use_auto_relay=False), ["QmA", "QmB"], 30.0)
    on = unreachable_warning(_cfg(use_auto_relay=True), ["QmA"], 30.0)
    assert off.startswith("2 peer(s) unreachable from here for 30s") and "set swarm.use_auto_relay: true" in off
    assert "4 or more public bootstraps" in on and "set swarm.use_auto_relay" not in on
