"""The wheel ships every subpackage (the list in pyproject.toml is explicit) and the example peer configs."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "swarm_node").rglob("__init__.py")}
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert cfg["package-dir"]["swarm_node.peers"] == "peers"
    assert "*.yaml" in cfg["package-data"]["swarm_node.peers"]
    assert (ROOT / "peers" / "tiny-s.yaml").is_file()
