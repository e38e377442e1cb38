"""Sampled membership over the network: quiet stores and reads of shard keys (swarm.sampling's policy),
with the same interface as membership.Membership. Piece B of issue 41 fills it in."""
