"""What runs inside one node process: the GRPO and DPO round loops and their per-process services.

Rollout admission (peers' batches -> training groups), checkpoints, metrics.jsonl and Prometheus, progress
lines, signal handling and logging. Launching many nodes is `swarm_node.runs`.
"""
