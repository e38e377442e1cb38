#!/bin/sh
# Docker HEALTHCHECK of the swarm-node image (installed as /usr/local/bin/swarm-node-healthcheck).
#
#   SWARM_NODE_BOOTSTRAP_FILE  the bootstrap's multiaddrs file (what `swarm-node bootstrap --maddrs-file`
#                              writes). Unset: nothing to check, healthy.
#   SWARM_NODE_SWARM           swarm id whose members are listed (default: demo)
#   SWARM_NODE_IDENTITY        this node's identity file (swarm.identity_path). Set: healthy only while
#                              `swarm-node status` lists this node's peer id. Unset (the bootstrap itself):
#                              healthy when `swarm-node status` gets an answer through the bootstrap.
set -eu

file=${SWARM_NODE_BOOTSTRAP_FILE:-}
[ -n "$file" ] || exit 0
if [ ! -s "$file" ]; then
  echo "no bootstrap multiaddrs in $file yet"
  exit 1
fi
# shellcheck disable=SC2046  # one multiaddr per line, each its own argument
members=$(swarm-node status --initial-peers $(grep '^/' "$file") --swarm "${SWARM_NODE_SWARM:-demo}" \
  --json --retries 0 --timeout 20) || exit 1
identity=${SWARM_NODE_IDENTITY:-}
if [ -z "$identity" ]; then
  echo "bootstrap answers"
  exit 0
fi
if [ ! -f "$identity" ]; then
  echo "no identity file $identity yet (the node has not joined)"
  exit 1
fi
printf '%s' "$members" | python -c '
import json, os, sys
from hivemind.p2p import PeerID
with open(os.environ["SWARM_NODE_IDENTITY"], "rb") as f:
    me = PeerID.from_identity(f.read()).to_base58()
members = [m["peer_id"] for m in json.load(sys.stdin)]
print(f"{me} listed among {len(members)} live peer(s)" if me in members else f"{me} not among {members}")
sys.exit(0 if me in members else 1)
'
