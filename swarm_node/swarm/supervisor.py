"""Supervising a peer's hivemind DHT child: its identity, calls into it, its P2P replica, restarts.

hivemind runs the DHT (and its p2pd) in a forked child process. A child that dies (killed, out of memory,
a p2pd crash) is replaced by a new one with the same identity, so the peer id, the records it signs and
the stream handlers other peers dial stay the same; the restart loop backs off up to 30 s while the
bootstrap is unreachable. Calls into the child go through one lock, so its pipe is written by one
thread at a time, and end early when the child dies (`dht.wait_dht_result`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing.connection
import threading
import time
from collections.abc import Callable

import hivemind
from hivemind.p2p import P2P

from swarm_node.config import SwarmConfig
from swarm_node.swarm import records
from swarm_node.swarm.addresses import pin_ports
from swarm_node.swarm.dht import (
    RefusalTally,
    ensure_identity,
    kill_dht,
    ping_peers,
    start_dht,
    wait_dht_result,
)
from swarm_node.swarm.loop import LoopThread

CALL_TIMEOUT_S = 10.0
RESTART_BACKOFF_MAX_S = 30.0
REJOIN_PEERS = 8  # connected peers remembered (with their addresses) to rejoin through after a restart
LIST_PEERS_TIMEOUT_S = 2.0  # a local call to our p2pd; one that hangs must not hold the heartbeat long

StreamHandler = Callable  # hivemind binary stream handler: async (info, reader, writer) -> None


class DHTUnavailable(RuntimeError):
    """The DHT child is down (being restarted)."""


class DHTSupervisor:
    """The DHT child of one peer, kept alive.

    Owns: the peer's identity (the key file, or a temporary one; its signing key, owner subkey and peer id),
    the record validators, the hivemind DHT child process, the lock that serialises calls into it, the
    P2P replica (`replicate_p2p`) with our stream handlers attached, the restart count, and the tally of
    records the child refused.
    May call: swarm.dht (start, kill, wait on the child), swarm.records (keys, validators), the LoopThread
    it is given (the P2P replica lives on it). Nothing above: it knows no blobs, peers or rounds.
    Thread: `start` and `close` on the owner's thread; `call`, `p2p` and `visible_maddrs` from any thread;
    `restart` from the one thread that watches the child (the heartbeat); the handlers run on the loop.
    """

    def __init__(self, cfg: SwarmConfig, loop: LoopThread, handlers: dict[str, StreamHandler],
                 log: logging.Logger) -> None:
        self.cfg = cfg
        self.loop = loop
        self.handlers = handlers
        self.log = log
        self.peer_id = ""
        self.subkey = b""
        self.restarts = 0
        self._identity = ""
        self._tmp_identity = None
        self._validators: list = []
        self._child: hivemind.DHT | None = None
        self._p2p: P2P | None = None
        self._p2p_socket: str | None = None
        self._listen_maddrs: list[str] = list(cfg.host_maddrs)  # with the ports the child got (pin_ports)
        self._rejoin: dict[str, list[str]] = {}  # peer id -> its maddrs, as our p2pd last saw them connected
        self._lock = threading.RLock()
        self._refusals = RefusalTally()

    # ---- lifecycle ----

    def start(self) -> None:
        """Make or load the identity, start the child (retrying the bootstrap; UserFacingError if it stays
        unreachable) and attach our handlers. On failure everything started is stopped again."""
        self._identity, self._tmp_identity, created = ensure_identity(self.cfg.identity_path)
        key = records.load_identity_key(self._identity)
        self.subkey = records.subkey_for(key)
        self.peer_id = records.peer_id_of_subkey(self.subkey) or ""
        self._validators = records.make_validators(self.cfg.swarm_id, key)
        try:
            self._child = start_dht(self.cfg, self._identity, self._validators, check_identity=not created,
                                    logger=self.log)
            self._attach_p2p()
            self._listen_maddrs = pin_ports(list(self.cfg.host_maddrs), self.visible_maddrs())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the P2P replica and the child; remove a temporary identity. Idempotent."""
        self._detach_p2p()
        if self._child is not None:
            kill_dht(self._child)
            self._child = None
        if self._tmp_identity is not None:
            self._tmp_identity.cleanup()
            self._tmp_identity = None

    # ---- using the child ----

    @property
    def child(self) -> hivemind.DHT | None:
        """The running hivemind DHT (None while it is restarted)."""
        return self._child

    @property
    def p2p(self) -> P2P | None:
        """Our P2P replica, for opening streams to peers (None while the child is restarted)."""
        return self._p2p

    def alive(self) -> bool:
        child = self._child
        return child is not None and child.is_alive()

    def call(self, method: str, *args, **kwargs):
        """`hivemind.DHT.<method>(*args, **kwargs)`; DHTUnavailable while restarting, ConnectionError if the
        child dies meanwhile, TimeoutError after CALL_TIMEOUT_S."""
        with self._lock:
            child = self._require()
            future = getattr(child, method)(*args, return_future=True, **kwargs)
        return wait_dht_result(child, future, CALL_TIMEOUT_S)

    def visible_maddrs(self) -> list[str]:
        with self._lock:
            return [str(m) for m in self._require().get_visible_maddrs()]

    def remember_peers(self) -> None:
        """Note the peers our p2pd is connected to, with their addresses (the heartbeat calls this): a new
        child gets them as initial peers, since the old p2pd's address book dies with it."""
        p2p = self._p2p
        if p2p is None:
            return
        try:
            peers = self.loop.run(asyncio.wait_for(p2p.list_peers(), LIST_PEERS_TIMEOUT_S), LIST_PEERS_TIMEOUT_S + 1)
        except Exception as exc:
            self.log.debug("listing connected peers: %s", exc)
            return
        for info in peers:
            pid = info.peer_id.to_base58()
            if pid != self.peer_id and info.addrs:
                self._rejoin.pop(pid, None)
                self._rejoin[pid] = [f"{a}/p2p/{pid}" for a in info.addrs[:2]]
        while len(self._rejoin) > REJOIN_PEERS:
            self._rejoin.pop(next(iter(self._rejoin)))

    def _known_maddrs(self) -> list[str]:
        """The configured initial peers, then the peers we were last connected to (`remember_peers`)."""
        return list(dict.fromkeys([*self.cfg.initial_peers, *(m for ms in self._rejoin.values() for m in ms)]))

    def rejoin(self) -> int:
        """Ping the configured initial peers and the peers we were last connected to, from the live child:
        after an outage (a link down for a minute) the child's routing table has dropped every peer whose
        RPCs failed, and nothing in hivemind dials them again. -> how many answered (0: none known/none up)."""
        maddrs = self._known_maddrs()
        if not maddrs:
            return 0
        try:
            return ping_peers(self.call, maddrs)
        except Exception as exc:
            self.log.debug("pinging %d known peer(s): %s", len(maddrs), exc)
            return 0

    def new_refusals(self) -> dict[str, int]:
        """Records the child refused since the last call, by reason ({} while it is unreachable)."""
        return self._refusals.poll(self.call)

    def _require(self) -> hivemind.DHT:
        child = self._child
        if child is None or not child.is_alive():
            raise DHTUnavailable("the DHT is restarting")
        return child

    # ---- restarts ----

    def dead_child(self) -> hivemind.DHT | None:
        """The child, if it has died (the heartbeat checks this after each `wait_for_exit`)."""
        child = self._child
        return child if child is not None and not child.is_alive() else None

    def wait_for_exit(self, timeout: float) -> None:
        """Sleep up to `timeout`, waking as soon as the child process exits (its sentinel), so a death is
        noticed at once rather than at the heartbeat thread's next 1 s poll: every second of an outage is a
        second in which the peer's records are not re-stored and its neighbours cannot reach it."""
        child = self._child
        try:
            sentinel = child.sentinel if child is not None else None
        except ValueError:  # not started, or already closed
            sentinel = None
        if sentinel is None:
            time.sleep(timeout)
            return
        multiprocessing.connection.wait([sentinel], timeout)

    def restart(self, dead: hivemind.DHT, stop: threading.Event) -> bool:
        """Replace a dead child with a new one of the same identity; retries with backoff until it is up
        (True) or `stop` is set (False). The caller then re-stores its records at once.

        The first try listens on the dead child's ports and joins through the configured initial peers plus
        the peers we were connected to (`remember_peers`). A new p2pd knows no one's address: a swarm's first
        node has no initial peers, so it could reach none of its peers and they, dialling its old port, none
        of it; both halves stayed apart (benchmarks/dht_recovery.py --killed first: no batch got through
        after a restart before this). If that try fails (ports taken, those peers gone), later ones start as
        configured."""
        t0 = time.monotonic()
        self.log.warning("DHT child (pid %s) died with exit code %s; restarting it", dead.pid, dead.exitcode)
        with self._lock:
            self._child = None
        self._detach_p2p()
        kill_dht(dead, self._p2p_socket)
        delay = 1.0
        rejoin = self._known_maddrs()
        same_ports = self.cfg.model_copy(update={"host_maddrs": self._listen_maddrs, "bootstrap_retries": 0,
                                                 "initial_peers": rejoin})
        cfg = same_ports
        while not stop.is_set():
            try:
                child = start_dht(cfg, self._identity, self._validators, check_identity=False, logger=self.log)
                with self._lock:
                    self._child = child
                self._attach_p2p()
                self._listen_maddrs = pin_ports(list(self.cfg.host_maddrs), self.visible_maddrs())
                break
            except Exception as exc:
                if self._child is not None:
                    kill_dht(self._child)
                    with self._lock:
                        self._child = None
                if cfg is same_ports:  # ports taken or those peers gone: start as configured
                    self.log.warning("restarting the DHT on its old ports %s through %d known peer(s) failed: %s",
                                     self._listen_maddrs, len(rejoin), exc)
                    cfg = self.cfg
                    continue
                self.log.error("restarting the DHT failed (retrying in %.0fs): %s", delay, exc)
                stop.wait(delay)
                delay = min(delay * 2, RESTART_BACKOFF_MAX_S)
        if stop.is_set():
            return False
        self.restarts += 1
        self.log.debug("DHT child restarted in %.1fs", time.monotonic() - t0)
        return True

    # ---- the P2P replica ----

    def _attach_p2p(self) -> None:
        async def attach():
            p2p = await self._child.replicate_p2p()
            for name, handler in self.handlers.items():
                await p2p.add_binary_stream_handler(name, handler)
            return p2p

        with self._lock:
            self._p2p = self.loop.run(attach(), CALL_TIMEOUT_S + 5)
            self._p2p_socket = str(self._p2p.daemon_listen_maddr).removeprefix("/unix")

    def _detach_p2p(self) -> None:
        p2p, self._p2p = self._p2p, None
        if p2p is not None and self.loop.running:
            try:
                self.loop.run(p2p.shutdown(), 5)
            except Exception as exc:
                self.log.debug("closing the P2P replica: %s", exc)
