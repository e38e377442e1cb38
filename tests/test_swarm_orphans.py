"""A node killed with SIGKILL takes its DHT child and p2pd daemon with it (no orphans holding ports)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm_node.swarm.dht import _children_of

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")]

NODE = """
import sys, time
from swarm_node.config import SwarmConfig
from swarm_node.swarm import PeerInfo, SwarmPeer
node = SwarmPeer(SwarmConfig(enabled=True, swarm_id="orphans", host_maddrs=["/ip4/127.0.0.1/tcp/0"]),
                 PeerInfo(mode="grpo", model_name="m", tokenizer_fp="fp", task_id="t"), validate=None).start()
print(node.dht.child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; whoever adopted it just has not reaped it


def test_sigkilled_node_leaves_no_dht_child_or_p2pd():
    proc = subprocess.Popen([sys.executable, "-c", NODE], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        dht_pid = int(proc.stdout.readline())
        deadline = time.monotonic() + 20
        p2pd = []
        while not p2pd and time.monotonic() < deadline:
            p2pd = _children_of(dht_pid)
            time.sleep(0.2)
        assert alive(dht_pid) and p2pd, "the DHT child and its p2pd should be running"
        os.kill(proc.pid, signal.SIGKILL)  # the node only, not its process group
        proc.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (alive(dht_pid) or any(alive(p) for p in p2pd)):
            time.sleep(0.2)
        assert not alive(dht_pid), "DHT child outlived its node"
        assert not any(alive(p) for p in p2pd), "p2pd outlived its node"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
