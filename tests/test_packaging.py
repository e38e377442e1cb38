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
    none of tooling/ (fuzzers, batch builders, adversaries, CHOCO) or tests/, which nothing installed imports."""
    import re
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for part in ("swarm_node", "peers", "tests", "tooling"):  # tests/ and tooling/ too: out even when there
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
    assert "swarm_node/swarm/peer.py" in names and "swarm_node/peers/tiny-s.yaml" in names  # not vacuous
    tooling = [n for n in names if re.search(r"fuzz|(^|/)batches\.py$|(^|/)(tests|tooling)/|adversary|choco", n)]
    assert tooling == [], tooling
    assert [n for n, text in sources.items() if re.search(r"^\s*(from|import) (tests|tooling)\b", text, re.M)] == []


# Releases with known vulnerabilities that reach this code (docs/operations.md, "Keeping the dependencies
# current"): no install of swarm-node may resolve to one of them.
KNOWN_VULNERABLE = {
    "torch": ["2.5.1", "2.9.1"],  # weights_only bypass (CVE-2025-32434, < 2.6); unpickler memory corruption (< 2.10)
    "transformers": ["4.46.3", "4.47.1", "4.52.4", "4.56.2", "4.57.1", "5.0.0", "5.2.0"],  # < 4.53; 4.56-5.2
    "jinja2": ["3.1.4", "3.1.5"],  # sandbox escapes (3.1.5, 3.1.6)
    "protobuf": ["5.29.4"],  # recursion DoS parsing untrusted messages (5.29.5)
    "pyarrow": ["14.0.0"],  # code execution from a crafted file (14.0.1)
}


def _requirements() -> dict:
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name.lower(): Requirement(d) for d in deps}


def test_dependency_ranges_leave_out_known_vulnerable_releases():
    reqs = _requirements()
    for name, versions in KNOWN_VULNERABLE.items():
        assert name in reqs, f"{name} is not bounded in pyproject.toml"
        let_in = [v for v in versions if reqs[name].specifier.contains(v, prereleases=True)]
        assert not let_in, f"{reqs[name]} admits {name} {let_in}"


def test_the_installed_set_satisfies_the_ranges():
    """What `make test` runs on is what pyproject allows (a release outside the range would go untested)."""
    from importlib.metadata import PackageNotFoundError, version

    for name, req in _requirements().items():
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = version(name)
        except PackageNotFoundError:
            pytest.fail(f"{name} is not installed")
        base = have.split("+")[0]  # torch's local version (+cpu) is no part of the range
        assert req.specifier.contains(base, prereleases=True), f"installed {name} {have} is outside {req}"
