"""The dashboard page and the numbers behind it: a live view of run dirs (and the swarm, from the DHT).

`summary` computes each peer's numbers from metrics.jsonl rows (`swarm-node report` uses the same
function), `tail` reads metrics files as nodes append to them, `data` gathers a page's JSON, `server`
serves the page (beside a node's /metrics), `swarm_view` reads the swarm's members from the DHT. It sits
below `node` so a node can serve its own page; it imports nothing above `swarm`.
"""
