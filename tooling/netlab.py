"""A small internet on one machine, made of network namespaces: a public segment, home NATs, thin uplinks.

Test tooling (tests and benchmarks/network.py share it; not in the wheel). As root it builds:

- an `inet` namespace holding one bridge: the public segment;
- public hosts, each a namespace with one veth on that bridge and an address of the public /24;
- home segments, each a NAT router namespace (its WAN veth on the bridge, nftables masquerade, a filter
  that lets in only replies to connections from inside) and one or more home hosts behind it, on a /24 of
  their own that no public host has a route to;
- per-uplink bandwidth caps: `tc` tbf on both ends of a host's (or a router's WAN) link, so upload and
  download are each capped at the given rate.

What it cannot do: this kernel has no `netem`, so there is no added latency or packet loss; links are as
fast as the bridge except where a cap is set. Nothing is faked in its place.

Every namespace name starts with `nl<tag>-`, the tag random per run. Home segments are 10.<a>.<i>.0/24; the
public segment is 11.<a>.0.0/24 (`a` random per run), not a private range, because libp2p treats 10/8 as
private: a relay advertises only its public addresses, and autorelay refuses a relay without one ("not a
public node"), so on a 10.x public segment peers behind NAT never reach each other (measured: 0 batches
NAT-to-NAT in 40 s, against exchange within ~20 s on 11.x). The `inet` namespace has no link to the
host's network, so no packet to these addresses can leave the lab. Namespaces are separate, so two concurrent runs never see each other's addresses or
interface names anyway. A lab is removed on every exit path: the context manager, an atexit hook and
SIGTERM/SIGINT/SIGHUP handlers (re-raised as SystemExit/KeyboardInterrupt so the `with` block unwinds);
`python -m tooling.netlab clean` removes what a SIGKILLed run left (namespaces whose owner is gone).

    with NetLab() as lab:
        pub = lab.public_host("boot")
        home = lab.home("h1", rate_mbit=10)
        proc = lab.popen(home, ["python", "-m", "swarm_node.cli", ...])

`unavailable()` says in one line why it cannot run here (not root, no `ip`, no nft/iptables, no `tc`), or
returns None; tests turn that line into a skip.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "nl"
OWNERS = Path("/run/netlab")  # <tag>.pid: which process owns a lab, for `clean`


def unavailable(need_tc: bool = True) -> str | None:
    """One line saying what is missing to build a lab here, or None when it can run."""
    if os.geteuid() != 0:
        return "netlab needs root (network namespaces, veth, nftables): run as root, e.g. in CI's container"
    if shutil.which("ip") is None:
        return "netlab needs `ip` (iproute2): apt-get install -y iproute2"
    if shutil.which("nft") is None and shutil.which("iptables") is None:
        return "netlab needs nftables or iptables for the NAT routers: apt-get install -y nftables"
    if need_tc and shutil.which("tc") is None:
        return "netlab needs `tc` (iproute2) for bandwidth caps: apt-get install -y iproute2"
    probe = f"{PREFIX}probe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"netlab cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run one command (inside namespace `ns` if given); raise with its stderr when it fails."""
    cmd = ["ip", "netns", "exec", ns, *args] if ns else list(args)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"netlab: `{' '.join(cmd)}` failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


@dataclass
class Host:
    """One machine of the lab: a namespace with one address (public, or private behind `router`)."""

    name: str
    ns: str
    ip: str
    router: Router | None = None
    rate_mbit: float | None = None

    @property
    def behind_nat(self) -> bool:
        return self.router is not None

    def maddr(self, port: int = 0) -> str:
        return f"/ip4/{self.ip}/tcp/{port}"


@dataclass
class Router:
    """A home segment's NAT router: `wan_ip` on the public segment, `lan_ip` the home hosts' gateway."""

    name: str
    ns: str
    wan_ip: str
    lan_ip: str
    subnet: str
    hosts: list[Host] = field(default_factory=list)


class NetLab:
    """Builds namespaces on demand and removes all of them (and their processes) on close."""

    def __init__(self, tag: str | None = None, public_first_octet: int = 11) -> None:
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self.tag = tag or secrets.token_hex(3)
        self.a = random.Random(self.tag).randrange(64, 250)  # 10.<a>.x.y for this run
        self.public_net = f"{public_first_octet}.{self.a}.0"  # the public segment's /24
        self.inet = self._ns("inet")
        self.namespaces: list[str] = []
        self.hosts: dict[str, Host] = {}
        self.routers: dict[str, Router] = {}
        self.procs: list[subprocess.Popen] = []
        self._next_public = 10
        self._next_home = 1
        self._closed = False
        self._old_handlers: dict[int, object] = {}
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / f"{self.tag}.pid").write_text(str(os.getpid()))
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            self._add_ns(self.inet)
            sh("ip", "link", "add", "name", "pubsw", "type", "bridge", ns=self.inet)
            sh("ip", "link", "set", "pubsw", "up", ns=self.inet)
        except BaseException:
            self.close()
            raise

    # ---- building -------------------------------------------------------------------------------------

    def _ns(self, name: str) -> str:
        return f"{PREFIX}{self.tag}-{name}"

    def _add_ns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)

    def _wire(self, ns: str, dev: str, port: str, ip: str, prefix: int, rate_mbit: float | None) -> None:
        """A veth from `ns` (named `dev`, address ip/prefix) to the inet bridge (named `port` there)."""
        sh("ip", "link", "add", "name", dev, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.inet)
        sh("ip", "link", "set", port, "master", "pubsw", "up", ns=self.inet)
        sh("ip", "addr", "add", f"{ip}/{prefix}", "dev", dev, ns=ns)
        sh("ip", "link", "set", dev, "up", ns=ns)
        if rate_mbit is not None:
            cap(ns, dev, rate_mbit)  # upload
            cap(self.inet, port, rate_mbit)  # download

    def public_host(self, name: str, rate_mbit: float | None = None) -> Host:
        """A host on the public segment, reachable by everyone at its address."""
        ns = self._ns(name)
        ip = f"{self.public_net}.{self._next_public}"
        self._next_public += 1
        self._add_ns(ns)
        self._wire(ns, "eth0", f"p{len(self.hosts) + len(self.routers)}", ip, 24, rate_mbit)
        host = Host(name, ns, ip, rate_mbit=rate_mbit)
        self.hosts[name] = host
        return host

    def home(self, name: str, rate_mbit: float | None = None, hosts: int = 1) -> list[Host] | Host:
        """A home segment: a NAT router on the public segment and `hosts` machines behind it.

        The cap applies to the router's WAN link (the home's uplink), shared by its hosts. Returns the
        host, or the list of hosts when `hosts` > 1.
        """
        i = self._next_home
        self._next_home += 1
        rns = self._ns(f"{name}-nat")
        wan_ip = f"{self.public_net}.{200 + i}"
        subnet = f"10.{self.a}.{i}.0/24"
        lan_ip = f"10.{self.a}.{i}.1"
        self._add_ns(rns)
        self._wire(rns, "wan", f"r{i}", wan_ip, 24, rate_mbit)
        router = Router(name, rns, wan_ip, lan_ip, subnet)
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=rns)
        nat_rules(rns, subnet)
        self.routers[name] = router
        out = []
        for j in range(hosts):
            hname = name if hosts == 1 else f"{name}-{j}"
            hns = self._ns(hname)
            hip = f"10.{self.a}.{i}.{10 + j}"
            self._add_ns(hns)
            sh("ip", "link", "add", "name", "eth0", "netns", hns, "type", "veth", "peer", "name", f"lan{j}", "netns", rns)
            sh("ip", "addr", "add", f"{hip}/24", "dev", "eth0", ns=hns)
            sh("ip", "link", "set", "eth0", "up", ns=hns)
            if j == 0:
                sh("ip", "link", "add", "name", "lan", "type", "bridge", ns=rns)
                sh("ip", "addr", "add", f"{lan_ip}/24", "dev", "lan", ns=rns)
                sh("ip", "link", "set", "lan", "up", ns=rns)
            sh("ip", "link", "set", f"lan{j}", "master", "lan", "up", ns=rns)
            sh("ip", "route", "add", "default", "via", lan_ip, ns=hns)
            host = Host(hname, hns, hip, router=router, rate_mbit=rate_mbit)
            router.hosts.append(host)
            self.hosts[hname] = host
            out.append(host)
        return out[0] if hosts == 1 else out

    # ---- what tests do with it ------------------------------------------------------------------------

    def popen(self, host: Host, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `cmd` inside the host's namespace (its children, the DHT child and p2pd, stay there)."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", host.ns, *cmd], **kwargs)
        self.procs.append(proc)
        return proc

    def wrap(self, host: Host) -> list[str]:
        """The command prefix that runs something in the host's namespace."""
        return ["ip", "netns", "exec", host.ns]

    def link(self, name: str, up: bool) -> None:
        """Cut (or restore) a host's or a home's link to the public segment."""
        if name in self.routers:
            sh("ip", "link", "set", "wan", "up" if up else "down", ns=self.routers[name].ns)
        else:
            sh("ip", "link", "set", "eth0", "up" if up else "down", ns=self.hosts[name].ns)

    def nat_bytes(self, name: str) -> dict[str, int]:
        """Bytes through a home's NAT router, from its WAN interface counters (rx: in from the public side)."""
        return link_bytes(self.routers[name].ns, "wan")

    def host_bytes(self, host: Host) -> dict[str, int]:
        """Bytes through a host's one interface (eth0), inside its namespace."""
        return link_bytes(host.ns, "eth0")

    # ---- teardown -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process left in our namespaces, delete the namespaces, forget the owner file."""
        if self._closed:
            return
        self._closed = True
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for ns in reversed(self.namespaces):
            remove_namespace(ns)
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        (OWNERS / f"{self.tag}.pid").unlink(missing_ok=True)
        for sig, handler in self._old_handlers.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass
        atexit.unregister(self.close)

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP -> SystemExit, SIGINT stays KeyboardInterrupt: the `with` block unwinds either way."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old = signal.getsignal(sig)
            if old in (signal.SIG_DFL, None):
                self._old_handlers[sig] = old
                signal.signal(sig, _exit_on_signal)


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def cap(ns: str, dev: str, rate_mbit: float) -> None:
    """Egress cap of `dev` in `ns` with a token bucket (tbf): rate, a burst of ~10 ms (>= 2 frames)."""
    rate_bit = int(rate_mbit * 1_000_000)
    burst = max(rate_bit // 8 // 100, 3200)
    sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_bit}bit", "burst", str(burst),
       "latency", "200ms", ns=ns)


def nat_rules(ns: str, subnet: str) -> None:
    """Masquerade the home subnet out of `wan`; forward into the home only replies (a home NAT, no forwards)."""
    if shutil.which("nft"):
        rules = f"""
table ip netlab {{
  chain masq {{ type nat hook postrouting priority 100; ip saddr {subnet} oifname "wan" masquerade; }}
  chain guard {{ type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan" oifname "wan" accept
  }}
}}
"""
        res = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"netlab: nft in {ns} failed: {res.stderr.strip()}")
        return
    sh("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", subnet, "-o", "wan", "-j", "MASQUERADE", ns=ns)
    sh("iptables", "-P", "FORWARD", "DROP", ns=ns)
    sh("iptables", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT", ns=ns)
    sh("iptables", "-A", "FORWARD", "-i", "lan", "-o", "wan", "-j", "ACCEPT", ns=ns)


def link_bytes(ns: str, dev: str) -> dict[str, int]:
    """rx/tx bytes of interface `dev` in namespace `ns`."""
    stats = json.loads(sh("ip", "-s", "-j", "link", "show", dev, ns=ns).stdout)[0]["stats64"]
    return {"rx_bytes": stats["rx"]["bytes"], "tx_bytes": stats["tx"]["bytes"]}


_LISTEN = "import socket,sys; s=socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True); s.settimeout(5); s.accept()"
_CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"


def tcp_reachable(src: Host, dst: Host, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection from `src` to a listener on `dst` gets through (no ping on this machine)."""
    server = subprocess.Popen(["ip", "netns", "exec", dst.ns, sys.executable, "-c", _LISTEN, dst.ip],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        res = subprocess.run(["ip", "netns", "exec", src.ns, sys.executable, "-c", _CONNECT, dst.ip, port,
                              str(timeout_s)], capture_output=True)
        return res.returncode == 0
    finally:
        server.kill()
        server.wait()


def remove_namespace(ns: str) -> None:
    """SIGKILL what still runs in `ns` (only our processes live there), then delete it."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
    for _ in range(50):
        if subprocess.run(["ip", "netns", "del", ns], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)


def our_namespaces(tag: str | None = None) -> list[str]:
    """Namespaces made by netlab (of one run, if `tag` is given)."""
    names = [ln.split()[0] for ln in sh("ip", "netns", "list").stdout.splitlines() if ln.strip()]
    start = f"{PREFIX}{tag}-" if tag else PREFIX
    return [n for n in names if n.startswith(start) and "-" in n]


def clean_stale() -> list[str]:
    """Remove the labs whose owning process is gone (a SIGKILLed run); return the namespaces removed."""
    removed = []
    for ns in our_namespaces():
        tag = ns[len(PREFIX):].split("-", 1)[0]
        owner = OWNERS / f"{tag}.pid"
        try:
            alive = owner.exists() and Path(f"/proc/{int(owner.read_text())}").exists()
        except ValueError:
            alive = False
        if not alive:
            remove_namespace(ns)
            owner.unlink(missing_ok=True)
            removed.append(ns)
    return removed


def main(argv: list[str] | None = None) -> int:
    """`check` (can it run here?), `clean` (remove stale labs), `demo` (build one, show it, tear it down)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tooling.netlab", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["check", "clean", "demo"])
    args = ap.parse_args(argv)
    if args.action == "check":
        reason = unavailable()
        print(reason or "netlab can run here")
        return 1 if reason else 0
    if args.action == "clean":
        removed = clean_stale()
        print(f"removed {len(removed)} stale namespace(s)" + (": " + " ".join(removed) if removed else ""))
        return 0
    with NetLab() as lab:
        pub = lab.public_host("pub", rate_mbit=50)
        home = lab.home("home", rate_mbit=10)
        print(f"lab {lab.tag}: public {pub.ip} ({pub.ns}), home {home.ip} behind {home.router.wan_ip} ({home.ns})")
        ok_out, ok_in = tcp_reachable(home, pub), tcp_reachable(pub, home)
        print(f"home -> public: {'reachable' if ok_out else 'UNREACHABLE'}; "
              f"public -> home: {'reachable (NAT broken!)' if ok_in else 'unreachable (as behind a NAT)'}")
        return 0 if ok_out and not ok_in else 1


if __name__ == "__main__":
    sys.exit(main())
