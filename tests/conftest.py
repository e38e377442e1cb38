"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-s and tiny-m, built once per test session (side by side, one core each) and shared.

    A developer may point $SWARM_NODE_PRESETS at a cache to skip the build; otherwise they are built into a
    session tmp dir, and $SWARM_NODE_PRESETS is set to it so that in-process `load_model("tiny-s")` and
    spawned node processes all use the same build.
    """
    import subprocess
    import sys

    from swarm_node.models.factory import ensure_preset

    env = os.environ.get("SWARM_NODE_PRESETS")
    root = Path(env) if env else tmp_path_factory.mktemp("presets")
    # A build uses one torch thread, so tiny-m builds in a second process meanwhile (ensure_preset locks).
    other = subprocess.Popen([sys.executable, "-c", "import sys; from swarm_node.models.factory import ensure_preset; "
                              "ensure_preset('tiny-m', sys.argv[1])", str(root)])
    ensure_preset("tiny-s", root)
    if other.wait() != 0:
        ensure_preset("tiny-m", root)  # raises the build's own error here
    os.environ["SWARM_NODE_PRESETS"] = str(root)
    return root
