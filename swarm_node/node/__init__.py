"""What runs inside one node process: the round loop both modes share, one GRPO and one DPO round, and
their per-process services.

loop (the daemon), grpo_node / dpo_node (a round of each mode), admission + rollouts + defences + reasons
(what of a peer's batch is trained on, and why the rest is not), rows + metrics (one typed row per round,
metrics.jsonl and Prometheus), checkpoint, progress, stopping, logs. Launching many nodes is `swarm_node.runs`.
"""
