"""Starting or joining a hivemind DHT: identity files, retries with a clear error, orphan cleanup; quiet stores
and reads of one key (sampled membership), which never fetch the key's whole dictionary."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import shlex
import signal
import tempfile
import time
from pathlib import Path

import hivemind
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from swarm_node.config import SwarmConfig
from swarm_node.errors import UserFacingError

DHT_REPLICAS = 3
"""Nodes a record is stored on (hivemind's default is 5). Every record here is re-stored well within its
TTL by its owner, so 3 replicas survive churn, and each store sends the record to 2 fewer nodes."""


IDENTITY_MODE = 0o400  # owner read-only, as hivemind leaves it; an existing key may also be 0600


def ensure_identity(identity_path: str | None) -> tuple[str, tempfile.TemporaryDirectory | None, bool]:
    """(path, temp dir to clean up, newly created) of an identity file, created if missing (parent dirs too).

    Without a configured path an ephemeral identity is made in a temp dir, so every node has an RSA key
    that both defines its peer id and signs its records (records are then bound to peer ids). An existing
    key that group or others may read is refused, as ssh refuses one (`check_identity_mode`).
    """
    tmp = None
    if identity_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="swarm-node-id-")
        identity_path = os.path.join(tmp.name, "identity.key")
    path = Path(identity_path).expanduser()
    created = not path.exists()
    if created:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = write_identity(path)
    elif not path.is_file():
        raise UserFacingError(f"identity path {path} exists but is not a file")
    if not created:
        check_identity_mode(path)
    return str(path), tmp, created


def write_identity(path: Path) -> bool:
    """Write a new RSA identity (libp2p's protobuf, as hivemind's `P2P.generate_identity`) to `path`; False if
    another process made one there first (theirs is kept).

    The key is never readable by anyone else, not for a moment and whatever the umask: it is written to a
    0600 temporary file in the same directory (mkstemp), made 0400, fsynced, and only then linked to its
    name. hivemind's own writer creates the file 0644 (less the umask), writes the key, then chmods it.
    """
    key = RSAPrivateKey()
    data = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, IDENTITY_MODE)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # never replaces a key that appeared meanwhile
        except FileExistsError:
            return False
    finally:
        os.unlink(tmp)
    return True


def check_identity_mode(path: Path) -> None:
    """Refuse a private key file that group or others may read or write (UserFacingError, with the fix)."""
    if os.name != "posix":
        return
    mode = Path(path).stat().st_mode & 0o777
    if mode & 0o077:
        raise UserFacingError(f"identity file {str(path)!r} is accessible by others (mode {mode:04o}); it holds this "
                              f"peer's private key: run `chmod 600 {shlex.quote(str(path))}` and start again")


def start_dht(
    cfg: SwarmConfig,
    identity_path: str,
    validators: list,
    *,
    initial_peers: list[str] | None = None,
    check_identity: bool = True,
    logger: logging.Logger | None = None,
) -> hivemind.DHT:
    """Start a DHT child process; retry an unreachable bootstrap, then fail naming the addresses."""
    log = logger or logging.getLogger(__name__)
    peers = [p.strip() for p in (cfg.initial_peers if initial_peers is None else initial_peers) if p.strip()]
    for maddr in [*peers, *cfg.host_maddrs, *cfg.announce_maddrs]:
        try:
            Multiaddr(maddr)
        except Exception as exc:
            raise UserFacingError(f"{maddr!r} is not a valid multiaddr ({_short(exc)}); "
                                  "expected e.g. /ip4/203.0.113.5/tcp/31337/p2p/Qm...") from None
    attempts = cfg.bootstrap_retries + 1
    last_error: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            return _DHT(
                initial_peers=peers or None,
                start=True,
                await_ready=False,
                host_maddrs=list(cfg.host_maddrs),
                announce_maddrs=list(cfg.announce_maddrs) or None,
                identity_path=identity_path,
                client_mode=cfg.client_mode,
                use_relay=cfg.use_relay,
                use_auto_relay=cfg.use_auto_relay,
                record_validators=validators,
                check_if_identity_free=check_identity,
                startup_timeout=cfg.bootstrap_timeout_s,
                bootstrap_timeout=cfg.bootstrap_timeout_s,
                num_replicas=DHT_REPLICAS,
                # a get would otherwise copy the whole value (the membership dictionary, one record per
                # peer) to the nearest node lacking it: a store of O(swarm) bytes on every read
                cache_nearest=0,
            )._wait_ready(cfg.bootstrap_timeout_s + 5.0)
        except UserFacingError:
            raise
        except Exception as exc:  # hivemind raises P2PDaemonError, TimeoutError, ValueError, ...
            last_error = exc
            log.warning("joining the swarm failed (attempt %d/%d): %s", attempt, attempts, _short(exc))
            if "already taken" in str(exc):
                break
            if attempt < attempts:
                time.sleep(min(2.0 ** (attempt - 1), 10.0))
    where = ", ".join(peers) if peers else "(no initial peers: starting a new swarm)"
    raise UserFacingError(
        f"could not join the swarm after {attempts} attempt(s); initial peers tried: {where}; "
        f"last error: {_short(last_error)}. Check that a bootstrap peer runs at these addresses and "
        "that its port is reachable from here (swarm.initial_peers, docs/operations.md)."
    )


def _short(exc: Exception | None) -> str:
    text = " ".join(str(exc).split()) if exc is not None else "unknown"
    return (text[:300] + "...") if len(text) > 300 else text


PARENT_POLL_S = 1.0


def _children_of(pid: int) -> list[int]:
    """Direct children of a process, read from /proc (Linux); [] where /proc is not there."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(stat.parent.name))
    return out


def _exit_when_orphaned(parent_pid: int) -> None:
    """In the DHT child: once the node process is gone (even by SIGKILL), stop our p2pd and exit.

    hivemind's child otherwise outlives a killed node, and so does its p2pd daemon, holding ports and CPU.
    """
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    for child in _children_of(os.getpid()):
        try:
            os.kill(child, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    os._exit(0)


class _DHT(hivemind.DHT):
    """hivemind.DHT that exits when its node dies, and whose start-up wait kills the child on failure."""

    def run(self) -> None:
        import threading

        from swarm_node.swarm import dht_bounds
        from swarm_node.swarm.records import REFUSALS

        threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), name="orphan-watch", daemon=True).start()
        REFUSALS.clear()  # a forked child inherits the parent's counts; it reports only its own
        dht_bounds.install()  # this process only: bounded storage and StoreRequests (what peers make us store)
        super().run()

    def _wait_ready(self, timeout: float) -> _DHT:
        try:
            self.wait_until_ready(timeout)
        except BaseException:
            kill_dht(self)
            raise
        return self



def kill_dht(dht: hivemind.DHT, p2pd_socket: str | None = None) -> None:
    """Stop a DHT child (and its p2pd, if it outlived the child) without waiting on a dead pipe."""
    if dht.is_alive():
        try:
            dht.shutdown()
        except Exception:  # the pipe may be broken already
            pass
    if dht.is_alive() and dht.pid:
        os.kill(dht.pid, signal.SIGKILL)
        dht.join(5)
    if p2pd_socket:
        kill_orphan_p2pd(p2pd_socket)


def kill_orphan_p2pd(socket_path: str) -> None:
    """SIGTERM a p2pd that still listens on our own (uniquely named) control socket after its parent died."""
    for pid_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if b"p2pd" in cmdline and socket_path.encode() in cmdline:
            try:
                os.kill(int(pid_dir.name), signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass


DEATH_POLL_S = 0.1


def wait_dht_result(dht: hivemind.DHT, future, timeout: float):
    """future.result(timeout) for a call into the DHT child, but raise at once if the child dies.

    A SIGKILLed child never answers, so a plain result(timeout) held the heartbeat thread for the whole
    timeout (10 s) before it could notice the death and restart the child: recovery took ~12 s instead
    of ~1 s whenever the kill landed during a call.
    """
    end = time.monotonic() + timeout
    while True:
        try:
            return future.result(min(DEATH_POLL_S, max(end - time.monotonic(), 0.0)))
        except TimeoutError:
            if not dht.is_alive():
                raise ConnectionError("the DHT child died during the call") from None
            if time.monotonic() >= end:
                raise


async def _read_refusals(_dht, _node) -> dict[str, int]:
    from swarm_node.swarm.records import REFUSALS

    return dict(REFUSALS)


async def _ping_peers(maddrs: list[str], _dht, node) -> int:
    """In the DHT child: dial each peer at its addresses and ping it, which puts it back in our routing
    table (and us in its); then look up our own neighbourhood again. -> how many answered."""
    from hivemind.p2p import PeerID

    by_peer: dict[PeerID, list[Multiaddr]] = {}
    for text in maddrs:
        maddr = Multiaddr(text)
        pid = maddr["p2p"]
        by_peer.setdefault(PeerID.from_base58(pid), []).append(maddr.decapsulate(Multiaddr(f"/p2p/{pid}")))

    async def ping(pid: PeerID, addrs: list[Multiaddr]) -> bool:
        try:  # hand p2pd the addresses again (its address book may have let them expire during an outage)
            await node.p2p._client.connect(pid, addrs)
        except Exception:
            pass  # refused, or libp2p's dial backoff after an outage: the ping may still get through
        return await node.protocol.call_ping(pid) is not None

    answered = sum(r is True for r in await asyncio.gather(*(ping(p, a) for p, a in by_peer.items()),
                                                            return_exceptions=True))
    if answered:
        await node.find_nearest_nodes([node.node_id])
    return answered


def ping_peers(dht_call, maddrs: list[str]) -> int:
    """Ping these peers from the DHT child (`dht_call`: DHTSupervisor.call) -> how many answered."""
    return dht_call("run_coroutine", functools.partial(_ping_peers, list(maddrs)))


def record_refusals(dht: hivemind.DHT, timeout: float = 5.0) -> dict[str, int]:
    """Records the DHT child refused since it started (RecordGuard and the storage bounds), by reason."""
    return dht.run_coroutine(_read_refusals, return_future=True).result(timeout)


class RefusalTally:
    """Turns the DHT child's running totals into counts added to a node's own rejection counters.

    The child's totals restart from zero when the child is restarted; a total lower than the last one
    seen is taken as a fresh start.
    """

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def poll(self, dht_call) -> dict[str, int]:
        """New refusals, read through `dht_call` (DHTSupervisor.call); {} while the DHT is unreachable."""
        try:
            return self.new_since_last(dht_call("run_coroutine", _read_refusals))
        except Exception:
            return {}

    def new_since_last(self, totals: dict[str, int]) -> dict[str, int]:
        if any(n < self._seen.get(r, 0) for r, n in totals.items()):
            self._seen = {}
        out = {r: n - self._seen.get(r, 0) for r, n in totals.items() if n > self._seen.get(r, 0)}
        self._seen = dict(totals)
        return out


# ---- quiet operations: a store or read of one key that never hauls the key's whole dictionary ----
#
# hivemind's `store` and `get` look the key itself up, and every node on the way that holds the key answers
# with its whole dictionary (for a shared key, one record per peer: O(swarm) bytes per lookup). A lookup of
# the neighbouring id key ^ 1 meets the same nodes in the same XOR order, but no node holds that id, so the
# lookup's replies carry node ids only; the replicas found are then asked directly.

QUIET_BEAM = 4  # beam of the lookup before a quiet store or read (as membership.STORE_BEAM, for the same reason)


async def _replicas_of(node, key_id: DHTID) -> dict:
    """In the DHT child: the DHT_REPLICAS nodes nearest `key_id` (ourselves included), nearest first, from a
    lookup of key_id ^ 1 (no holder answers it with a value)."""
    near = DHTID(int(key_id) ^ 1)
    found = await node.find_nearest_nodes([near], k_nearest=DHT_REPLICAS, beam_size=QUIET_BEAM)
    return dict(sorted(found[near].items(), key=lambda item: key_id.xor_distance(item[0])))


async def _quiet_store(key: str, subkey, value, expiration: float, _dht, node) -> int:
    """In the DHT child: sign one (key, subkey, value) record and store it on the key's replicas -> how many
    took it."""
    key_id = DHTID.generate(source=key)
    replicas = await _replicas_of(node, key_id)
    protocol = node.protocol
    record = DHTRecord(key_id.to_bytes(), protocol.serializer.dumps(subkey), protocol.serializer.dumps(value),
                       expiration)
    validator = protocol.record_validator
    if validator is not None:
        record = dataclasses.replace(record, value=validator.sign_value(record))

    async def store_on(node_id: DHTID, peer_id) -> bool:
        if node_id == node.node_id:
            if validator is not None and not validator.validate(record):
                return False
            return bool(protocol.storage.store(key_id, record.value, expiration, subkey=subkey))
        ok = await protocol.call_store(peer_id, [key_id], [record.value], expiration, subkeys=[subkey])
        return bool(ok and ok[0])

    done = await asyncio.gather(*(store_on(n, p) for n, p in replicas.items()), return_exceptions=True)
    return sum(r is True for r in done)


async def _quiet_read(key: str, _dht, node) -> tuple[dict | None, int]:
    """In the DHT child: one replica's copy of `key`'s dictionary, nearest replica first (the next one if a
    replica does not answer or holds nothing) -> ({subkey: ValueWithExpiration(value, expiration)} with
    signatures stripped, or None if no replica answered; bytes of the entries received)."""
    from hivemind.utils.timed_storage import ValueWithExpiration, get_dht_time

    key_id = DHTID.generate(source=key)
    protocol = node.protocol
    answered = False
    for node_id, peer_id in (await _replicas_of(node, key_id)).items():
        if node_id == node.node_id:
            found = protocol.storage.get(key_id)
        else:
            reply = await protocol.call_find(peer_id, [key_id])
            if reply is None:
                continue
            found = reply[key_id][0]
        answered = True
        value = found.value if found is not None else None
        if not hasattr(value, "freeze"):  # nothing here, or a plain value (not a member dictionary)
            continue
        out: dict = {}
        size = 0
        now = get_dht_time()
        with value.freeze():
            for subkey, (value_bytes, expiration) in value.items():
                subkey_bytes = protocol.serializer.dumps(subkey)
                size += len(subkey_bytes) + len(value_bytes)
                if expiration < now:
                    continue
                if protocol.record_validator is not None:
                    value_bytes = protocol.record_validator.strip_value(
                        DHTRecord(key_id.to_bytes(), subkey_bytes, value_bytes, expiration))
                try:
                    out[subkey] = ValueWithExpiration(protocol.serializer.loads(value_bytes), expiration)
                except Exception:
                    continue  # not msgpack: parse_signed would refuse it anyway
        return out, size
    return ({} if answered else None), 0


def quiet_store(dht_call, key: str, subkey, value, expiration: float) -> int:
    """Store one record under `key` on its replicas without fetching the key's dictionary (`dht_call`:
    DHTSupervisor.call) -> how many replicas took it."""
    return dht_call("run_coroutine", functools.partial(_quiet_store, key, subkey, value, expiration))


def quiet_read(dht_call, key: str) -> tuple[dict | None, int]:
    """One replica's copy of `key`'s dictionary, in `DHT.get`'s value shape, and its size in bytes; None if
    no replica answered (`dht_call`: DHTSupervisor.call)."""
    return dht_call("run_coroutine", functools.partial(_quiet_read, key))


SIZE_SAMPLE = 20  # neighbours whose spread gives the size estimate (hivemind's bucket size)


async def _size_estimate(_dht, node) -> float:
    """In the DHT child: the DHT's size from our own routing table, free of network calls: k nodes within XOR
    distance d of us among ids spread uniformly over 2^160 means about k * 2^160 / d nodes in all (fewer
    than k known: every node is known)."""
    near = node.protocol.routing_table.get_nearest_neighbors(node.node_id, SIZE_SAMPLE, exclude=node.node_id)
    if len(near) < SIZE_SAMPLE:
        return float(len(near) + 1)
    farthest = max(node.node_id.xor_distance(node_id) for node_id, _peer in near)
    return SIZE_SAMPLE * float(DHTID.MAX) / max(farthest, 1)


def dht_size_estimate(dht_call) -> float:
    """About how many nodes the DHT has (all swarms sharing it, bootstraps included), from our routing table
    (`dht_call`: DHTSupervisor.call): a joiner's first guess at its shard level."""
    return dht_call("run_coroutine", _size_estimate)
