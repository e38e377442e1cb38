"""swarm-node: decentralized peer-to-peer RL post-training (F-TIS GRPO, gossip DPO) on hivemind."""

__version__ = "0.1.0"
