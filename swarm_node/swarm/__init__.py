"""swarm package."""
