# CPU image for the local demo swarm (compose.yaml). GPU users: start from a CUDA base and let
# scripts/setup.sh pick the CUDA torch build.
FROM python:3.11-slim
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY swarm_node ./swarm_node
COPY peers ./peers
COPY scripts ./scripts
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir -e .
ENV PYTHONUNBUFFERED=1
