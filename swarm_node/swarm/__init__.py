"""The network half of a node: joining a hivemind swarm, signed membership, blob exchange over P2P."""

from swarm_node.swarm.node import PeerInfo, Received, SwarmNode
from swarm_node.swarm.records import KINDS, Announcement, BlobEntry, MemberRecord

__all__ = ["KINDS", "Announcement", "BlobEntry", "MemberRecord", "PeerInfo", "Received", "SwarmNode"]
