"""A smoke run of benchmarks/specialties.py: three peers of different models, each sampling its own part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_specialties_smoke(presets_dir, tmp_path):
    out = tmp_path / "spec.json"
    arms = ["alone:add", "alone:sub", "alone:signed", "alone:full", "ftis"]
    res = subprocess.run([sys.executable, "-m", "benchmarks.specialties", "--quick", "--seeds", "1",
                          "--rounds", "1", "--eval-n", "30", "--curve-every", "100", "--curve-n", "15", "--workers", "1",
                          "--arms", *arms, "--json", str(out), "--png", str(tmp_path / "spec.png")],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = data["runs"]
    # alone arms: every model alone on every part and on the full mix; the swarm arm: all three together
    assert len(runs) == 3 * 4 + 3 and {r["arm"] for r in runs} == set(arms)
    for r in runs:
        assert len(r["hits_end"]) == 30 and set(r["end"]) == {"union", "add", "sub", "signed"}
        assert r["end"]["union"] == pytest.approx(sum(r["end"][p] for p in ("add", "sub", "signed")) / 3)
        # every curve point, the ends too, on the same first curve_n (15: 5 per part) union problems
        (r0, first), (r1, last) = r["curve"][0], r["curve"][-1]
        assert (r0, r1) == (0, 1)
        assert first["union"] == pytest.approx(sum(map(int, r["hits_start"][:15])) / 15)
        assert last["union"] == pytest.approx(sum(map(int, r["hits_end"][:15])) / 15)
    swarm = [r for r in runs if r["arm"] == "ftis"]
    assert {(r["model"], r["part"]) for r in swarm} == {("tiny-s", "add"), ("tiny-m", "sub"), ("tiny-s-lora", "signed")}
    claims = {c["model"]: c for c in data["claims"]}
    assert set(claims) == {"tiny-s", "tiny-m", "tiny-s-lora"}
    for c in claims.values():
        assert c["a_verdict"] in ("holds", "does not hold") and c["c_verdict"] in ("holds", "does not hold", "cannot tell")
        assert set(c["b"]) == {"add", "sub", "signed"} - {c["own"]}
    assert "(a) union vs alone on add" in res.stdout and (tmp_path / "spec.png").stat().st_size > 0
