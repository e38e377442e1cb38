"""DPO parameters on the network: their wire codec (`payload`, its refusal names `reasons`) and hivemind's
all-reduce (`allreduce`, `checked_averager`).

The one part of swarm/ that handles tensors: the codec is hivemind's tensor compression and the all-reduce
is hivemind's averager, so both live in the network room (only swarm_node.swarm imports hivemind). What
the DPO round does with a step's result is dpo/mixing.py.
"""
