"""DPO's parameter gossip: the payload codec, the mixing weights and their graphs, the all-reduce.

Pure math and codecs except `exchange` (fetches over a swarm object it is given) and `allreduce`
(hivemind's averager); the DPO round loop that uses them is `swarm_node/node/dpo_node.py`.
"""

from swarm_node.gossip.mixing import (
    GossipResult,
    RejectCounter,
    combine,
    consensus_distance,
    federated_step,
    gossip_step,
    live_mixing_row,
    pull_ratio,
)
from swarm_node.gossip.payload import COMPRESSIONS, PayloadError, decode_params, encode_params
from swarm_node.gossip.vectors import (
    arch_fingerprint,
    get_params,
    params_digest,
    params_probe,
    params_sq_distance,
    set_params,
)

__all__ = [
    "COMPRESSIONS", "GossipResult", "PayloadError", "RejectCounter", "arch_fingerprint", "combine",
    "consensus_distance", "decode_params", "encode_params", "federated_step", "get_params", "gossip_step",
    "live_mixing_row", "params_digest", "params_probe", "params_sq_distance", "pull_ratio", "set_params",
]
