"""tooling/loopback.py: the loopback byte counter the network benchmarks read, and their namespace re-run."""

from __future__ import annotations

from tooling import loopback

DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
  eth0: 999999     10    0    0    0     0          0         0   888888      10    0    0    0     0       0          0
    lo: 123456     78    0    0    0     0          0         0   654321      87    0    0    0     0       0          0
"""


def test_lo_bytes_reads_the_loopback_interface_transmitted_bytes(tmp_path):
    dev = tmp_path / "dev"
    dev.write_text(DEV)
    assert loopback.lo_bytes(str(dev)) == 654321  # lo's transmitted bytes: not received, not eth0's
    dev.write_text("\n".join(line for line in DEV.splitlines() if "lo:" not in line))
    assert loopback.lo_bytes(str(dev)) == 0


def test_the_real_counter_moves_with_loopback_traffic():
    import socket

    before = loopback.lo_bytes()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    client.sendall(b"x" * 100_000)
    got = 0
    while got < 100_000:
        got += len(conn.recv(65536))
    for s in (client, conn, server):
        s.close()
    assert loopback.lo_bytes() - before >= 100_000


def test_no_namespace_means_no_rerun(monkeypatch):
    monkeypatch.setattr(loopback.shutil, "which", lambda _name: None)
    assert loopback.netns_available() is False
    assert loopback.rerun_in_netns("benchmarks.control_costs", ["--help"]) is None
    monkeypatch.setenv(loopback.IN_NETNS_ENV, "1")
    assert loopback.in_private_netns()
