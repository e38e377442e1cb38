"""The network half of a node, and the only package that imports hivemind: joining a swarm, signed
membership, blobs over P2P.

`SwarmPeer` (swarm/peer.py) is the one class the node side uses; its parts are listed in its module. DPO's
parameters on the wire and hivemind's all-reduce are `swarm/averaging/`.
"""

from swarm_node.swarm import reasons
from swarm_node.swarm.intake import Offer
from swarm_node.swarm.membership import PeerInfo
from swarm_node.swarm.peer import SwarmPeer
from swarm_node.swarm.receiver import PayloadRefused, Received, RoundIntake, Validator, keep_raw
from swarm_node.swarm.records import KINDS, Announcement, BlobEntry, MemberRecord

__all__ = ["KINDS", "Announcement", "BlobEntry", "MemberRecord", "Offer", "PayloadRefused", "PeerInfo", "Received",
           "RoundIntake", "SwarmPeer", "Validator", "keep_raw", "reasons"]
