"""Per-message wire costs of the control plane, in one place: what the simulator charges for each message.

Every figure is bytes on the loopback wire (both directions of one exchange, counted once, as
benchmarks/swarm_scale.py's counter counts them). `load_costs` takes them from docs/data/control_costs.json
(benchmarks/control_costs.py, a measurement; docs/results/exchange-and-scale.md, "Unit control costs")
through the explicit table MEASURED below: each field from its source key, converted where the measured
figure includes something the field does not (a find measured with 2 neighbour ids in its answer). The
defaults are the *estimates* the simulator ran on before that measurement; they remain only for what was not
measured (find_peer, ids_per_reply, full_holders). Nothing here is fitted to the 4-32 peer totals the
simulator is checked against.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_COSTS_JSON = Path(__file__).resolve().parents[2] / "docs" / "data" / "control_costs.json"


@dataclass(frozen=True)
class Costs:
    """Bytes per message on the wire. Defaults: the pre-measurement estimates (est.)."""

    push: float = 1200.0  # est.: ~275 B app frame (swarm_scale's app counter / pushes) + ~10 packets x ~90 B
    download_overhead: float = 700.0  # est.: request, response framing, ~8 packets of TCP/noise/yamux, less payload
    find_base: float = 500.0  # est.: a call_find request + reply without neighbours or value
    find_per_id: float = 60.0  # hivemind serializer: one neighbour (DHTID + peer id) in a find reply
    ids_per_reply: int = 20  # bucket size k: neighbours per find reply (fewer in a smaller DHT)
    store_rpc: float = 1400.0  # est.: call_store of one signed record (~1 KB) + reply + packets
    entry: float = 970.0  # hivemind serializer: one member dictionary entry (subkey 391 B + signed value 567 B)
    batch_entry: float = 970.0  # est.: one batch-record dictionary entry, taken as a member entry
    new_connection: float = 5000.0  # est.: TCP + noise/TLS + yamux + identify (3-10 KB)
    find_peer: float = 4000.0  # est.: a libp2p-Kademlia FindPeer (~4 RPCs) when a dialled address is unknown
    idle_per_conn_s: float = 6.0  # est.: keep-alives per open connection (counted once, not per end) and second
    full_holders: int = 3  # replicas of a full-mode key (hivemind stores to 3); the writer may be one of them

    def scaled(self, **factors: float) -> Costs:
        """A copy with some costs multiplied (the calibration test's can-fail twins)."""
        return dataclasses.replace(self, **{k: getattr(self, k) * f for k, f in factors.items()})

    def find_rpc(self, dht_nodes: int) -> float:
        """One find RPC in a DHT of `dht_nodes`: base plus up to k neighbour ids."""
        return self.find_base + self.find_per_id * min(self.ids_per_reply, max(dht_nodes - 1, 0))


def _usable(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _num(doc: dict, key: str) -> float:
    """A measured figure: a non-negative number (a bool, string or absent key keeps the estimate)."""
    value = doc[key]
    if not _usable(value):
        raise ValueError(f"{key}={value!r}")
    return float(value)


def _find_base(doc: dict) -> float:
    """The measured find base carried `find_reply_ids` neighbour ids (4 DHT nodes): take them out, at the
    app-level size of one id, so that find_rpc adds them back per DHT size."""
    return _num(doc, "find_base_bytes") - _num(doc, "find_reply_ids") * _num(doc, "find_per_id_app_bytes")


# field -> (source key(s) in control_costs.json, conversion): every measured figure the simulator uses
MEASURED: dict[str, tuple[str, Callable[[dict], float]]] = {
    "push": ("push_bytes", lambda d: _num(d, "push_bytes")),
    "download_overhead": ("download_4k_overhead_bytes", lambda d: _num(d, "download_4k_overhead_bytes")),
    "find_base": ("find_base_bytes - find_reply_ids x find_per_id_app_bytes", _find_base),
    "find_per_id": ("find_per_id_app_bytes (app level: no per-id packet overhead)",
                    lambda d: _num(d, "find_per_id_app_bytes")),
    "store_rpc": ("store_rpc_bytes", lambda d: _num(d, "store_rpc_bytes")),
    "entry": ("find_per_entry_bytes", lambda d: _num(d, "find_per_entry_bytes")),
    "batch_entry": ("find_per_entry_bytes (a batch record taken as a member record: not measured apart)",
                    lambda d: _num(d, "find_per_entry_bytes")),
    "new_connection": ("new_connection_bytes", lambda d: _num(d, "new_connection_bytes")),
    "idle_per_conn_s": ("idle_bytes_per_conn_s (the swarm's idle rate / its connections)",
                        lambda d: _num(d, "idle_bytes_per_conn_s")),
}


def load_costs(path: Path | str | None = DEFAULT_COSTS_JSON) -> tuple[Costs, dict[str, str]]:
    """The estimates, replaced by the measured figures of `path` through MEASURED, then by any numeric key
    (flat, or under "costs") that names a field itself (an explicit override). Returns the costs and where
    each came from ("est.", or the file and its source key). An absent or unreadable file keeps the
    estimates; a measured key that is absent or not a usable number keeps that field's estimate."""
    costs = Costs()
    source = {f.name: "est." for f in dataclasses.fields(Costs)}
    if path is None or not Path(path).exists():
        return costs, source
    try:
        doc: Any = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        log.warning("control costs %s unreadable (%s): keeping the estimates", path, e)
        return costs, source
    if not isinstance(doc, dict):
        return costs, source
    updates: dict[str, Any] = {}
    for fname, (key, convert) in MEASURED.items():
        try:
            value = convert(doc)
        except (KeyError, TypeError, ValueError):
            continue
        if _usable(value):
            updates[fname] = value
            source[fname] = f"{path}: {key}"
    table = doc.get("costs", {}) if isinstance(doc.get("costs"), dict) else {}
    for key, value in {**{k: v for k, v in doc.items() if k in source}, **table}.items():
        if key in source and _usable(value):
            updates[key] = type(getattr(costs, key))(value)
            source[key] = f"{path}: {key}"
        else:
            log.info("control costs: key %r not used", key)
    return dataclasses.replace(costs, **updates), source
