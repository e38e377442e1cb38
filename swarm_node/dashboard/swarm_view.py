"""Who is in a swarm, read from the DHT without joining it: `swarm-node status` and the dashboard's swarm view.

A read-only client: it starts a hivemind DHT in client mode with a throwaway identity, reads the signed
member records (signatures checked, shapes checked per swarm), and registers nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

STATUS_LEVELS = 4  # sampled membership: read every shard key of levels 0-4 (31 keys a swarm)
DEFAULT_SWARMS = ("default", "demo")  # swarm.swarm_id's default, and the id `swarm-node demo` and peers/*.yaml use


class SwarmReader:
    """A client DHT for reading member records; `members()` as often as needed, `close()` at the end."""

    def __init__(self, initial_peers: Sequence[str], swarm_ids: Sequence[str], *, retries: int = 2,
                 timeout_s: float = 15.0):
        from swarm_node.config import SwarmConfig
        from swarm_node.swarm.dht import ensure_identity, start_dht
        from swarm_node.swarm.records import load_identity_key, make_validators

        self.swarm_ids = list(swarm_ids)
        cfg = SwarmConfig(
            enabled=True, swarm_id=self.swarm_ids[0], initial_peers=list(initial_peers),
            host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True, bootstrap_retries=max(retries, 0),
            bootstrap_timeout_s=timeout_s,
        )
        identity, self._tmp, _ = ensure_identity(None)
        key = load_identity_key(identity)
        # signature validation is the same for every swarm; shapes are checked again by parse_signed per swarm
        try:
            self._dht = start_dht(cfg, identity, make_validators(cfg.swarm_id, key), check_identity=False)
        except BaseException:
            self._tmp.cleanup()
            raise

    def members(self) -> dict[str, list]:
        """{swarm id: [MemberRecord]} of the live members, sorted by peer id: the full member key (DPO's
        membership) and every shard key of sampled membership at levels 0..STATUS_LEVELS, all read at once.
        A sampled writer at level L stores at L-1..L+1, so this lists every peer of a swarm up to ~250 peers
        (levels <= 5); a bigger swarm is larger than the list."""
        from swarm_node.swarm.records import MemberRecord, members_key, parse_signed
        from swarm_node.swarm.sampling import shard_key

        keys = {sid: [members_key(sid)] + [shard_key(sid, lv, sh) for lv in range(STATUS_LEVELS + 1)
                                           for sh in range(2**lv)] for sid in self.swarm_ids}
        futures = {(sid, k): self._dht.get(k, latest=True, return_future=True) for sid, ks in keys.items() for k in ks}
        found: dict[str, dict] = {sid: {} for sid in self.swarm_ids}
        for (sid, _key), fut in futures.items():
            try:
                value = fut.result()
            except Exception as exc:  # one key that cannot be read costs only its records
                log.debug("reading %s: %s", _key, exc)
                continue
            members, _problems = parse_signed(value.value if value is not None else None, MemberRecord)
            for pid, m in members.items():
                if pid not in found[sid] or m.updated > found[sid][pid].updated:
                    found[sid][pid] = m
        return {sid: sorted(ms.values(), key=lambda m: m.peer_id) for sid, ms in found.items()}

    def close(self) -> None:
        from swarm_node.swarm.dht import kill_dht

        try:
            kill_dht(self._dht)
        finally:
            self._tmp.cleanup()


class SwarmWatch:
    """The dashboard's swarm view: a background thread that re-reads the members every `interval_s`.

    Joining can take a while (or fail: a wrong address); the page shows what the thread last saw, or the
    one-line reason it has nothing, and the page itself never waits for the DHT.
    """

    def __init__(self, initial_peers: Sequence[str], swarm_ids: Sequence[str] | None = None,
                 interval_s: float = 5.0):
        self.initial_peers = list(initial_peers)
        self.swarm_ids = list(swarm_ids or DEFAULT_SWARMS)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._snapshot: dict = {"state": "joining", "error": None, "updated": None, "swarms": {}}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-swarm-view", daemon=True)

    def start(self) -> SwarmWatch:
        self._thread.start()
        return self

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._snapshot)

    def _set(self, **kw) -> None:
        with self._lock:
            self._snapshot = {**self._snapshot, **kw}

    def _run(self) -> None:
        reader = None
        try:
            while not self._stop.is_set():
                try:
                    if reader is None:
                        reader = SwarmReader(self.initial_peers, self.swarm_ids)
                    swarms = {sid: [m.model_dump() for m in rows] for sid, rows in reader.members().items()}
                    self._set(state="ok", error=None, updated=time.time(), swarms=swarms)
                except Exception as exc:  # a DHT problem is shown on the page, never raised into the server
                    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    error = f"cannot read the swarm from {self.initial_peers[0]}: {msg}"
                    if error != self.snapshot()["error"]:  # once per distinct problem, not every interval
                        log.warning("swarm view: %s", error)
                    self._set(state="error", error=error)
                    if reader is not None:
                        reader.close()
                        reader = None
                self._stop.wait(self.interval_s)
        finally:
            if reader is not None:
                reader.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
