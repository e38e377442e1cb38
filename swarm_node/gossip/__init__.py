"""What is left of the old gossip folder: `choco` (CHOCO-Gossip, measured in a benchmark).

The DPO mode lives in `swarm_node/dpo/`, the parameters' codec and all-reduce in `swarm_node/swarm/averaging/`.
"""
