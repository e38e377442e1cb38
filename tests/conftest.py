"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-s and tiny-m built once per test session (about a minute together on 2 CPU cores), shared."""
    from swarm_node.models.factory import ensure_preset

    root = tmp_path_factory.mktemp("presets")
    for name in ("tiny-s", "tiny-m"):
        ensure_preset(name, root)
    return root
