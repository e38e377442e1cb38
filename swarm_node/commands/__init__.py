"""One module per `swarm-node` command, each exposing NAME, HELP, add_arguments and run; `swarm_node/cli.py` discovers them."""
