#!/usr/bin/env bash
# The network lab of tooling/netlab.py (namespaces, NAT routers, tc caps), from a checkout, as root:
#   scripts/netlab.sh check    can it run here? (one line saying what is missing, exit 1)
#   scripts/netlab.sh demo     build a public host and a home behind NAT, probe both ways, tear down
#   scripts/netlab.sh clean    remove namespaces left by runs that were SIGKILLed
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" -m tooling.netlab "$@"
