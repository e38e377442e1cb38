"""A discrete-event simulator of the swarm's control plane (membership, announcements, downloads, DHT lookups)
at 100-10,000 peers, calibrated against real peers at 4-32 (benchmarks/swarm_sim.py)."""
