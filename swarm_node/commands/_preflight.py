"""Checks a command runs before it loads a model or starts a DHT, so a user's mistake costs one line, not a
traceback after a minute of work.

Each check raises UserFacingError with the problem and the fix; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
import time
from pathlib import Path

from swarm_node.errors import UserFacingError
from swarm_node.swarm.addresses import components

EXPECTED_PEER = "/ip4/HOST/tcp/PORT/p2p/<peer id> (as printed by `swarm-node bootstrap`)"

_held_locks: list = []  # open lock files, kept for the life of the process


def _through_file(path: Path) -> Path | None:
    """The first existing non-directory on the way to `path` (a file where a directory must be), if any."""
    for parent in [*reversed(path.parents), path]:
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def writable_dir(path: Path, what: str) -> Path:
    """Create `path` (and parents) and prove a file can be written in it; return it resolved.

    A real write is the only reliable test: root passes every permission check, yet still cannot write to a
    read-only mount or an immutable directory.
    """
    path = Path(path).expanduser()
    blocker = _through_file(path)
    if blocker is not None:
        raise UserFacingError(f"{what} {str(path)!r} runs through {str(blocker)!r}, which is a file, not a directory; "
                              f"pick another {what}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = {errno.EROFS: "is on a read-only file system", errno.EACCES: "is not writable (permission denied)",
                  errno.EPERM: "is not writable (operation not permitted; immutable?)",
                  errno.ENOSPC: "is on a full disk"}.get(exc.errno, f"cannot be written ({exc.strerror})")
        raise UserFacingError(f"{what} {str(path)!r} {reason}; pick a writable {what}") from None
    return path


def port_free(port: int, host: str, what: str) -> None:
    """Refuse a TCP port another process listens on (p2pd listens with SO_REUSEPORT, so it would share it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers, not listeners
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserFacingError(f"{what}: port {port} on {host} is already in use by another process "
                                      "(another node or bootstrap peer?); pick a free port, or tcp/0 for any") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserFacingError(f"{what}: {host} is not an address of this machine; "
                                      "use 0.0.0.0, 127.0.0.1 or one of its own addresses") from None
            raise UserFacingError(f"{what}: cannot listen on {host}:{port} ({exc.strerror})") from None


def listen_ports_free(maddrs: list[str], what: str) -> None:
    """Every explicit TCP port (not tcp/0) of these listen multiaddrs is free on this machine."""
    for maddr in maddrs:
        c = components(maddr)
        port = c.get("tcp")
        if not port or not port.isdigit() or int(port) == 0:
            continue
        host = c.get("ip4") or c.get("ip6")
        if host is None:
            continue
        port_free(int(port), host, f"{what} {maddr}")


def peer_addresses(maddrs: list[str], what: str) -> None:
    """A bootstrap address must name the peer: libp2p cannot dial a bare host:port, and would retry for ages."""
    for maddr in maddrs:
        if not maddr.strip().startswith("/"):
            raise UserFacingError(f"{what} {maddr!r} is not a multiaddr; expected {EXPECTED_PEER}")
        if "p2p" not in components(maddr.strip()) and "/p2p/" not in maddr:
            raise UserFacingError(f"{what} {maddr!r} has no /p2p/<peer id>; expected {EXPECTED_PEER}")


def read_peers_file(path: Path, wait_s: float) -> list[str]:
    """The multiaddrs in `path` (what `swarm-node bootstrap --maddrs-file` writes), waiting up to `wait_s` for them.

    Containers started together reach this before the bootstrap peer has written its file; the bootstrap
    writes it atomically, so a reader never sees half an address.
    """
    end = time.monotonic() + wait_s
    while True:
        if path.is_file():
            peers = [ln.strip() for ln in path.read_text().splitlines() if ln.strip().startswith("/")]
            if peers:
                return peers
        if time.monotonic() >= end:
            raise UserFacingError(f"no multiaddrs in {path} after {wait_s:.0f}s (is the bootstrap peer running?)")
        time.sleep(1.0)


def identity_private(identity_path: str | None) -> None:
    """An existing identity file that group or others may read is refused before the model loads."""
    if identity_path and Path(identity_path).expanduser().is_file():
        from swarm_node.swarm.dht import check_identity_mode

        check_identity_mode(Path(identity_path).expanduser())


def lock_identity(identity_path: str | None) -> None:
    """Hold `<identity>.lock` for the life of this process: two live peers with one identity are refused.

    Two peers with one key would overwrite each other's signed records; hivemind only detects it when the
    other peer is reachable through the initial peers, which a bootstrap peer does not have.
    """
    if not identity_path:
        return
    path = Path(identity_path).expanduser()
    lock_path = path.with_name(path.name + ".lock")
    writable_dir(lock_path.parent, "identity directory")
    fh = open(lock_path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        owner = fh.read().strip()
        fh.close()
        held = f"pid {owner}" if owner.isdigit() else "another process"
        raise UserFacingError(f"identity {str(path)!r} is already in use by a running peer ({held} holds "
                              f"{str(lock_path)!r}); stop it first, or give this peer its own identity file") from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    _held_locks.append(fh)
