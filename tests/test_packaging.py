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


def test_the_wheel_ships_no_fuzzer_or_test_builder(tmp_path):
    """Build the wheel from a copy of the sources and list its files: the package, the peer configs, and
    none of the test tooling (tests/tooling/: fuzzers, batch builders), which nothing installed imports."""
    import re
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for part in ("swarm_node", "peers", "tests"):  # tests/ too: it must stay out even when it is there
        shutil.copytree(ROOT / part, src / part, ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    out = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-c", "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))",
                            str(out)], cwd=src, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    with zipfile.ZipFile(out / build.stdout.split()[-1]) as whl:
        names = whl.namelist()
        sources = {n: whl.read(n).decode() for n in names if n.endswith(".py")}
    assert "swarm_node/swarm/node.py" in names and "swarm_node/peers/tiny-s.yaml" in names  # not vacuous
    tooling = [n for n in names if re.search(r"fuzz|(^|/)batches\.py$|(^|/)tests/|adversary", n)]
    assert tooling == [], tooling
    assert [n for n, text in sources.items() if re.search(r"^\s*(from|import) tests\b", text, re.M)] == []
