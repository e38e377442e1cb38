"""The DPO mode in one folder: the round (`round.py`, `DPONode`) and its round policy.

`neighbours` plans whom a round fetches from and averages with (over a swarm peer it is given),
`topology` the graphs and mixing matrices, `mixing` the gossip and federated averaging math, `robust`
the defences against hostile neighbours, `bypass` routing around a missing or refused one, `vectors` a
model's trainable parameters as a list of tensors. The parameters' wire codec and hivemind's all-reduce
are network code: `swarm_node/swarm/averaging/`.
"""


from swarm_node.dpo.mixing import (
    GossipResult,
    RejectCounter,
    combine,
    consensus_distance,
    federated_step,
    gossip_step,
    live_mixing_row,
    pull_ratio,
)
from swarm_node.dpo.vectors import (
    arch_fingerprint,
    get_params,
    params_digest,
    params_probe,
    params_sq_distance,
    set_params,
)
from swarm_node.swarm.averaging.payload import COMPRESSIONS, PayloadError, decode_params, encode_params

__all__ = [
    "COMPRESSIONS", "GossipResult", "PayloadError", "RejectCounter", "arch_fingerprint", "combine",
    "consensus_distance", "decode_params", "encode_params", "federated_step", "get_params", "gossip_step",
    "live_mixing_row", "params_digest", "params_probe", "params_sq_distance", "pull_ratio", "set_params",
]
