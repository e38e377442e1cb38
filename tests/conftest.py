"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-s and tiny-m, built once per test session (about 45 s together on 2 CPU cores) and shared.

    A developer may point $SWARM_NODE_PRESETS at a cache to skip the build; otherwise they are built into a
    session tmp dir, and $SWARM_NODE_PRESETS is set to it so that in-process `load_model("tiny-s")` and
    spawned node processes all use the same build.
    """
    from swarm_node.models.factory import ensure_preset

    env = os.environ.get("SWARM_NODE_PRESETS")
    root = Path(env) if env else tmp_path_factory.mktemp("presets")
    for name in ("tiny-s", "tiny-m"):
        ensure_preset(name, root)
    os.environ["SWARM_NODE_PRESETS"] = str(root)
    return root


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that needs the built presets is slow (building them takes a minute): mark it so, whatever its file
    says, so `make test-quick` (-m "not slow") never builds them."""
    for item in items:
        if "presets_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
