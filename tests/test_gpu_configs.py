"""The GPU configs in peers/ (a full Qwen2.5-0.5B-Instruct, a LoRA Qwen2.5-1.5B-Instruct): each validates, its
memory plan fits a 24 GB card at its real sizes, and it runs one round on this CPU, on a random-init stand-in of
the same architecture and vocabulary built offline (models/standins.py), with the vLLM backend, chat prompts and
its task; no hub is reached. The round is shrunk (1 prompt x 2 samples x 8 tokens): a CPU cannot run 64 x 512
tokens of a 0.5B model in a test's time, and the sizes are what `swarm-node plan` checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm_node.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"qwen2.5-0.5b-instruct": "qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct-lora": "qwen2.5-1.5b-instruct"}
SHRINK = ["task.prompts_per_round=1", "generation.num_generations=2", "generation.max_new_tokens=8",
          "generation.max_prompt_tokens=96", "task.eval_n=2", "generation.vllm.kv_cache_gib=0.25", "rounds=1",
          "swarm.enabled=false", "threads=2"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_gpu_config_validates_and_its_plan_fits_a_24gb_card(name, tmp_path):
    from swarm_node.models.standins import standin_config
    from swarm_node.planning import GIB, plan_node

    cfg = load_config(ROOT / "peers" / f"{name}.yaml")
    assert cfg.generation.backend == "vllm" and cfg.task.prompt_form == "chat"
    assert 256 <= cfg.generation.max_new_tokens <= 512
    standin_config(CONFIGS[name]).save_pretrained(tmp_path)  # the config alone: a plan reads no weight
    cfg.model.path = str(tmp_path)
    plan, advice = plan_node(cfg, device="cuda", device_bytes=24 * GIB)
    assert plan.fits and plan.peak > 4 * GIB, plan.rows()
    assert plan.engine and plan.engine_sleeps and not advice


def _vllm() -> bool:
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("SWARM_NODE_REQUIRE_VLLM") == "1":
            raise RuntimeError("SWARM_NODE_REQUIRE_VLLM=1 but vllm is not installed (scripts/setup.sh dev,vllm)")
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_gpu_config_runs_a_round_on_cpu_on_a_random_init_stand_in(name, tmp_path):
    if not _vllm():
        pytest.skip("vllm is not installed")
    model = tmp_path / "model"
    build = subprocess.run([sys.executable, "-m", "swarm_node.cli", "make-model", "--standin", CONFIGS[name],
                            "--out", str(model), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    assert json.loads(build.stdout)["random_init"] is True
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    overrides = [f"model.path={model}", *SHRINK]
    res = subprocess.run([sys.executable, "-m", "swarm_node.cli", "run", "--config", str(ROOT / "peers" / f"{name}.yaml"),
                          "--state-dir", str(tmp_path / "state"), *[x for o in overrides for x in ("--set", o)]],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=1100)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "state" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[1]["stepped"] or rows[1]["zero_advantage_groups"] == 1  # random weights: both samples may score 0
    assert rows[0]["eval_n"] == 2
