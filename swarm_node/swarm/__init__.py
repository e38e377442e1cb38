"""The network half of a node: joining a hivemind swarm, signed membership, blob exchange over P2P.

`SwarmPeer` (swarm/peer.py) is the one class the node side uses; its parts are listed in its module.
"""

from swarm_node.swarm import reasons
from swarm_node.swarm.intake import Offer
from swarm_node.swarm.membership import PeerInfo
from swarm_node.swarm.peer import SwarmPeer
from swarm_node.swarm.receiver import PayloadRefused, Received, RoundIntake, Validator, keep_raw
from swarm_node.swarm.records import KINDS, Announcement, BlobEntry, MemberRecord

__all__ = ["KINDS", "Announcement", "BlobEntry", "MemberRecord", "Offer", "PayloadRefused", "PeerInfo", "Received",
           "RoundIntake", "SwarmPeer", "Validator", "keep_raw", "reasons"]
