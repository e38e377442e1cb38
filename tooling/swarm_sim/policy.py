"""The sampled membership's pure policy, as the simulator uses it: the node's own (swarm_node.swarm.sampling),
so the simulated levels, views and push targets are the ones real peers run."""

from swarm_node.swarm.sampling import (
                                       MAX_LEVEL,
                                       SHARD_SUBKEYS,
                                       SHARD_TARGET,
                                       VIEW_SIZE,
                                       LevelPolicy,
                                       ViewBook,
                                       initial_level,
                                       pick_targets,
                                       random_read_key,
                                       shard_of,
                                       write_keys,
)

__all__ = ["MAX_LEVEL", "SHARD_SUBKEYS", "SHARD_TARGET", "VIEW_SIZE", "shard_of", "write_keys", "random_read_key",
           "initial_level", "LevelPolicy", "ViewBook", "pick_targets"]
