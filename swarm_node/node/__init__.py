"""What one node process runs whatever its mode: the round loop and the per-process services.

loop (the daemon: resume, join, rounds, checkpoints, stop; `RoundNode`, `run_node`), rows + metrics (one
typed row per round, metrics.jsonl and Prometheus), reasons (every reason either mode counts a refusal
under), checkpoint, progress, stopping, logs, trackers, timing. Each mode's round and its policy is a
folder of its own, above this one: `swarm_node/grpo/`, `swarm_node/dpo/`. Launching many nodes is
`swarm_node.runs`.
"""
