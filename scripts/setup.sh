#!/usr/bin/env bash
# Create .venv and install swarm-node with the right torch for this machine.
#   - a machine with an NVIDIA GPU (nvidia-smi works): the default PyPI torch (CUDA build);
#   - otherwise: torch==2.13.0, which pip resolves to a CPU build where one is available locally
#     (set SWARM_NODE_TORCH_INDEX=https://download.pytorch.org/whl/cpu on other CPU machines to avoid
#     the multi-GB CUDA wheel).
# Idempotent: a second run only reinstalls the project itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SWARM_NODE_VENV:-.venv}
EXTRAS=${1:-}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] GPU found: installing the CUDA build of torch"
    $PIP install "torch>=2.3"
  elif [ -n "${SWARM_NODE_TORCH_INDEX:-}" ]; then
    echo "[setup] no GPU: installing torch from $SWARM_NODE_TORCH_INDEX"
    $PIP install torch==2.13.0 --index-url "$SWARM_NODE_TORCH_INDEX"
  else
    echo "[setup] no GPU: installing torch==2.13.0 (CPU)"
    $PIP install torch==2.13.0
  fi
fi

spec="."
[ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
echo "[setup] installing swarm-node $spec"
$PIP install -e "$spec" 2>&1 | grep -v "is ignored: it is neither" || true
"$VENV/bin/python" -c "import swarm_node, torch, hivemind; print(f'[setup] ok: torch {torch.__version__}, hivemind {hivemind.__version__}')"
