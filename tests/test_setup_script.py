"""scripts/setup.sh on a GPU machine: the NVIDIA driver is checked before anything is installed, and an old one
stops the setup in one line. (The rest of the GPU branch, vLLM's CUDA build first and the CUDA and `import
vllm` checks after, runs only where a GPU is: benchmarks/gpu_smoke.py's machine.) The GPU is an `nvidia-smi`
on PATH that answers as the real one does; nothing is installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fake_nvidia_smi(bin_dir: Path, driver: str) -> None:
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0)";;
  *driver_version*) echo "{driver}";;
  *name,memory.total*) echo "NVIDIA GeForce RTX 4090, 24564 MiB";;
esac
""")
    script.chmod(0o755)


@pytest.mark.parametrize("driver", ["535.104.05", "470.256.02"])
def test_an_old_nvidia_driver_stops_the_setup_in_one_line_before_installing(tmp_path, driver):
    _fake_nvidia_smi(tmp_path / "bin", driver)
    venv = tmp_path / "venv"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SWARM_NODE_VENV": str(venv)}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "dev,vllm"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 1
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("[setup]")]
    assert len(lines) == 1 and f"NVIDIA driver {driver}" in lines[0] and ">= 580" in lines[0], res.stdout
    assert "RTX 4090" in lines[0] and "SWARM_NODE_CPU=1" in lines[0]
    assert not venv.exists()  # nothing created, nothing installed
