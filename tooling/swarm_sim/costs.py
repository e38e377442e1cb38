"""Per-message wire costs of the control plane, in one place: what the simulator charges for each message.

Every figure is bytes on the loopback wire (both directions of one exchange, counted once, as
benchmarks/swarm_scale.py's counter counts them). The defaults are *estimates* (labelled below with how they
were derived); `load_costs` overrides any of them from docs/data/control_costs.json (benchmarks/control_costs.py,
a measurement) when that file exists and carries a matching numeric key. Nothing here is fitted to the
4-32 peer totals the simulator is checked against.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_COSTS_JSON = Path(__file__).resolve().parents[2] / "docs" / "data" / "control_costs.json"


@dataclass(frozen=True)
class Costs:
    """Bytes per message on the wire (est. = estimate, not yet measured)."""

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
    idle_per_conn_s: float = 6.0  # est.: yamux keep-alive (~170 B every 30 s) per open connection
    full_holders: int = 3  # replicas that answer a full-mode lookup with the whole dictionary

    def scaled(self, **factors: float) -> Costs:
        """A copy with some costs multiplied (the calibration test's can-fail twins)."""
        return dataclasses.replace(self, **{k: getattr(self, k) * f for k, f in factors.items()})

    def find_rpc(self, dht_nodes: int) -> float:
        """One find RPC in a DHT of `dht_nodes`: base plus up to k neighbour ids."""
        return self.find_base + self.find_per_id * min(self.ids_per_reply, max(dht_nodes - 1, 0))


def load_costs(path: Path | str | None = DEFAULT_COSTS_JSON) -> tuple[Costs, dict[str, str]]:
    """The estimates, overridden by every numeric key of `path` (flat, or under "costs") that names a field.
    Returns the costs and where each came from ("est." or the file). An absent or unreadable file keeps the
    estimates; unknown keys are ignored and logged (the lead reconciles the names)."""
    costs = Costs()
    source = {f.name: "est." for f in dataclasses.fields(Costs)}
    if path is None or not Path(path).exists():
        return costs, source
    try:
        doc: Any = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        log.warning("control costs %s unreadable (%s): keeping the estimates", path, e)
        return costs, source
    table = doc.get("costs", doc) if isinstance(doc, dict) else {}
    updates = {}
    for key, value in (table.items() if isinstance(table, dict) else []):
        if key in source and isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            updates[key] = type(getattr(costs, key))(value)
            source[key] = str(path)
        else:
            log.info("control costs: key %r not used", key)
    return dataclasses.replace(costs, **updates), source
