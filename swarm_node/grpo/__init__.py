"""The GRPO mode in one folder: the round (`round.py`, `GRPONode`) and its peer-batch policy.

admission (what of a peer's batch is trained on: the decode-thread payload check, then one call per round),
rollouts (peers' batches -> training groups, own samples -> a batch), defences (replay window, audits, share
cap, newcomer gate), limits (the receive limits a config implies), pipeline (the next round's sampling in a
background thread). The reasons they count are the node's one registry, `swarm_node/node/reasons.py`.
"""
