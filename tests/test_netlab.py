"""The network lab (tooling/netlab.py): NAT, bandwidth caps, and teardown on every exit path.

Needs root, `ip`, nftables/iptables and `tc`; skipped with the harness's one-line reason otherwise.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tooling import netlab
from tooling.netlab import NetLab, our_namespaces, tcp_reachable

REASON = netlab.unavailable()
needs_lab = pytest.mark.skipif(REASON is not None, reason=REASON or "")

PIPE = textwrap.dedent("""
    import socket, sys, time
    role, host, port, n, direction = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    if role == "listen":
        srv = socket.create_server((host, 0)); print(srv.getsockname()[1], flush=True); c, _ = srv.accept()
    else:
        c = socket.create_connection((host, port))
    if (role == "listen") == (direction == "to_listener"):
        got, t0 = 0, None
        while (b := c.recv(1 << 16)):
            t0 = t0 or time.monotonic(); got += len(b)
        print(got, time.monotonic() - t0, flush=True)
    else:
        c.sendall(b"x" * n); c.close()
""")


@needs_lab
def test_nat_lets_out_and_keeps_in():
    with NetLab() as lab:
        pub = lab.public_host("pub")
        a, b = lab.home("a"), lab.home("b")
        assert tcp_reachable(a, pub) and tcp_reachable(b, pub)
        assert not tcp_reachable(pub, a, timeout_s=1.0)  # nobody outside opens a connection into a home
        assert not tcp_reachable(b, a, timeout_s=1.0)
        assert a.router.wan_ip.split(".")[0] == "11"  # the public segment looks public to libp2p (see netlab)


def mbit_s(listener, dialer, nbytes: int, direction: str) -> float:
    """Mbit/s of `nbytes` over one TCP connection that `dialer` opens to `listener` (NAT'ed hosts dial)."""
    srv = subprocess.Popen(["ip", "netns", "exec", listener.ns, sys.executable, "-c", PIPE, "listen", listener.ip,
                            "0", str(nbytes), direction], stdout=subprocess.PIPE, text=True)
    port = srv.stdout.readline().strip()
    cli = subprocess.run(["ip", "netns", "exec", dialer.ns, sys.executable, "-c", PIPE, "dial", listener.ip, port,
                          str(nbytes), direction], capture_output=True, text=True, timeout=60, check=True)
    out = srv.stdout.readline() if direction == "to_listener" else cli.stdout
    srv.wait(10)
    got, secs = out.split()
    assert int(got) == nbytes
    return nbytes * 8 / float(secs) / 1e6


@needs_lab
def test_uplink_cap_bounds_throughput():
    """A 2 Mbit/s home uplink: 300 KB each way takes >= ~1.2 s (load can slow it, never speed it up)."""
    with NetLab() as lab:
        pub = lab.public_host("pub")
        thin = lab.home("thin", rate_mbit=2)
        up = mbit_s(pub, thin, 300_000, "to_listener")
        down = mbit_s(pub, thin, 300_000, "to_dialer")
        assert up < 2 * 1.3 and down < 2 * 1.3, (up, down)
        free = mbit_s(pub, lab.public_host("pub2"), 300_000, "to_listener")  # no cap: far faster
        assert free > 10 * up, (free, up)


@needs_lab
def test_torn_down_on_exception_and_close():
    with pytest.raises(RuntimeError, match="boom"):
        with NetLab() as lab:
            lab.public_host("x")
            lab.home("y")
            tag = lab.tag
            assert len(our_namespaces(tag)) == 4  # inet, x, y's router and y
            raise RuntimeError("boom")
    assert our_namespaces(tag) == []


CHILD = textwrap.dedent("""
    import sys, time
    from tooling.netlab import NetLab
    lab = NetLab()
    lab.home("h")
    print(lab.tag, flush=True)
    time.sleep(60)
""")


@needs_lab
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_torn_down_when_its_process_is_signalled(sig):
    # a shell starts background jobs with SIGINT ignored, and Python keeps it so: give the child the default
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    tag = child.stdout.readline().strip()
    assert len(our_namespaces(tag)) == 3
    child.send_signal(sig)
    child.wait(20)
    assert our_namespaces(tag) == []


@needs_lab
def test_clean_removes_what_a_killed_run_left():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    tag = child.stdout.readline().strip()
    child.kill()  # no handler runs: the namespaces stay
    child.wait(10)
    assert len(our_namespaces(tag)) == 3
    removed = netlab.clean_stale()
    assert set(removed) >= {f"nl{tag}-inet", f"nl{tag}-h", f"nl{tag}-h-nat"}
    assert our_namespaces(tag) == []


@needs_lab
def test_processes_in_the_lab_are_killed_at_close():
    with NetLab() as lab:
        h = lab.public_host("h")
        proc = lab.popen(h, [sys.executable, "-c", "import time; time.sleep(60)"])
        time.sleep(0.2)
    assert proc.wait(5) == -signal.SIGKILL  # killed at close (its sleep had 60 s to go), not left running


def test_unavailable_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(netlab.os, "geteuid", lambda: 1000)
    assert "root" in netlab.unavailable()
    monkeypatch.setattr(netlab.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netlab.shutil, "which", lambda name: None if name == "ip" else f"/usr/sbin/{name}")
    assert "`ip`" in netlab.unavailable()
    monkeypatch.setattr(netlab.shutil, "which", lambda name: None if name in ("nft", "iptables") else "/x")
    assert "nftables" in netlab.unavailable()
