"""Run a local multi-peer swarm as real processes on 127.0.0.1 (what compose.yaml does with containers).

Used by `swarm-node demo` and by the multi-process tests: a bootstrap peer, then one `swarm-node run`
process per peer config, each with its own state dir and log file.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from swarm_node.errors import UserFacingError


def child_env(threads: int = 1) -> dict[str, str]:
    """Environment for peer processes: one compute thread each, so peers share 2 cores fairly."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "swarm_node.cli", *args]


@dataclass
class Bootstrap:
    proc: subprocess.Popen
    maddrs: list[str]

    def stop(self) -> None:
        stop_process(self.proc)


def start_bootstrap(workdir: Path, swarm_id: str, timeout_s: float = 60.0, *,
                    host_maddr: str = "/ip4/127.0.0.1/tcp/0", initial_peers: list[str] | None = None,
                    wrap: list[str] | None = None) -> Bootstrap:
    """Start `swarm-node bootstrap` (on 127.0.0.1 unless told) and wait for its first printed multiaddr.

    `wrap` prefixes the command (e.g. `ip netns exec NS`, to run it inside a network namespace).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    extra = ["--initial-peers", *initial_peers] if initial_peers else []
    with open(workdir / "bootstrap.log", "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [*(wrap or []), *cli("bootstrap", "--host-maddrs", host_maddr, "--identity", str(workdir / "bootstrap.key"),
                                 "--swarm", swarm_id, *extra)],
            stdout=subprocess.PIPE, stderr=log, env=child_env(), start_new_session=True,
        )
    end = time.monotonic() + timeout_s
    maddrs: list[str] = []
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    while time.monotonic() < end and not maddrs:
        if proc.poll() is not None:
            raise UserFacingError(f"bootstrap peer exited with code {proc.returncode}; see {workdir / 'bootstrap.log'}")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            buf += os.read(fd, 65536)
        maddrs = [ln.strip() for ln in buf.decode(errors="replace").splitlines() if ln.startswith("/")]
    if not maddrs:
        stop_process(proc)
        raise UserFacingError(f"bootstrap peer printed no address within {timeout_s:.0f}s; see {workdir / 'bootstrap.log'}")
    return Bootstrap(proc, maddrs)


@dataclass
class Peer:
    name: str
    config: Path
    state_dir: Path
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    wrap: list[str] = field(default_factory=list)  # a command prefix, e.g. `ip netns exec NS`
    env: dict[str, str] = field(default_factory=dict)  # set in the child's environment (e.g. CUDA_VISIBLE_DEVICES)
    threads: int = 1  # the child's OMP/MKL threads

    @property
    def metrics(self) -> Path:
        return self.state_dir / "metrics.jsonl"

    def start(self, initial_peers: list[str] | None, log_level: str = "info") -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.state_dir / "node.log"
        args = ["run", "--config", str(self.config), "--state-dir", str(self.state_dir), "--log-level", log_level,
                *self.extra_args]
        if initial_peers:
            args += ["--initial-peers", *initial_peers]
        with open(self.log_path, "a") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([*self.wrap, *cli(*args)], stdout=log, stderr=subprocess.STDOUT,
                                         env={**child_env(self.threads), **self.env}, start_new_session=True)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def write_peer_config(template: Path, out: Path, overrides: dict) -> Path:
    """Copy a peers/*.yaml template with nested overrides applied (rounds, task, swarm settings...)."""
    data = yaml.safe_load(Path(template).read_text()) or {}
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> int | None:
    """SIGTERM to the node itself (it finishes the round, checkpoints, leaves), SIGKILL to its group if it hangs."""
    return stop_processes([proc], grace_s)[0]


def stop_processes(procs: list[subprocess.Popen], grace_s: float = 30.0) -> list[int | None]:
    """Stop several nodes at once: one SIGTERM each, one shared grace period, then SIGKILL what is left.

    Only the main process gets SIGTERM: signalling the whole group would also stop the node's DHT child
    and p2p daemon at once, so the round in progress would lose its network and wait out the collect
    deadline before the node could checkpoint. Leftovers of each group are killed once its node is gone,
    also when the caller is interrupted while waiting.
    """
    live = [p for p in procs if p.poll() is None]  # reaped earlier: its pid may be reused, signal nothing
    try:
        for p in live:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace_s
        for p in live:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(p.pid)
                p.wait(10)
    finally:
        for p in live:
            if p.poll() is None:
                _kill_group(p.pid)
                p.wait(10)
            _kill_group(p.pid)
    return [p.returncode for p in procs]


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group started with start_new_session=True (DHT child, p2pd)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
