"""Find RPCs per Kademlia lookup against the DHT's size: hivemind's own traverse_dht, probed (design §2.4,
/work/notes/probe_kad.py, k = 20, beam 4, 4 workers, 100 lookups per size), interpolated in log N."""

from __future__ import annotations

import math

# N -> mean find RPCs of a quiet (beam 4) lookup, from the probe's table
PROBED_RPCS = ((100, 4.0), (1_000, 5.3), (3_000, 7.0), (10_000, 7.7))


def lookup_rpcs(dht_nodes: int) -> float:
    """Mean find RPCs of one lookup in a DHT of `dht_nodes` (never more than the other nodes there are)."""
    n = max(dht_nodes, 2)
    pts = PROBED_RPCS
    if n <= pts[0][0]:
        rpcs = pts[0][1]
    elif n >= pts[-1][0]:
        rpcs = pts[-1][1]
    else:
        for (n0, r0), (n1, r1) in zip(pts, pts[1:], strict=False):
            if n0 <= n <= n1:
                rpcs = r0 + (r1 - r0) * (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
                break
    return min(rpcs, n - 1)
