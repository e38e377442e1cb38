"""vLLM tests that start an engine of their own (a LoRA-serving engine, the tiny-s preset's engine).

vLLM's in-process engine keeps its parallel groups in process-wide state, and tears that state down when an
engine shuts down. Two engines alive at once therefore share one state, and closing either breaks the other.
So these tests live apart from test_vllm.py's module engine, each closes its engine before it ends, and each
collects garbage right after its engine starts: an earlier engine's teardown left to the collector would
land there and break this one (CI saw "pipeline model parallel group is not initialized").
"""

from __future__ import annotations

import gc

import pytest

from swarm_node.config import GenerationConfig, LoraConfig
from swarm_node.models.loading import load_model
from tests.vllm_support import KV_GIB, step_and_check_sync, text_prompts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def started(loaded, cfg):
    from swarm_node.generation.vllm_backend import VLLMGenerator

    engine = VLLMGenerator.for_loaded_model(loaded, cfg)
    gc.collect()  # any earlier engine's pending teardown runs now, before this engine is used
    return engine


def test_weight_sync_after_a_lora_step_served_as_a_vllm_adapter(head64_model_dir):
    """generation.vllm.lora_sync=adapter: the base weights stay in the engine, the trained adapter is saved
    and served as a LoRA request after every step (an engine started with LoRA enabled)."""
    loaded = load_model(str(head64_model_dir), dtype="float32", device="cpu",
                        lora=LoraConfig(enabled=True, r=4, alpha=8))
    engine = started(loaded, GenerationConfig(backend="vllm", max_new_tokens=16, max_prompt_tokens=48,
                                              vllm={"kv_cache_gib": KV_GIB, "lora_sync": "adapter",
                                                    "max_lora_rank": 8}))
    try:
        assert engine._lora_request is not None
        r = step_and_check_sync(engine, loaded.model, text_prompts(loaded), lr=3e-2)
        assert r["gap_new"] <= 1e-4, r
        assert r["gap_old"] > 1e-2
        first = engine._lora_request.lora_int_id
        engine.sync_weights(loaded.model)
        assert engine._lora_request.lora_int_id == first + 1, "a new id per sync: vLLM caches adapters by id"
    finally:
        engine.close()


def test_evaluation_through_the_engine_scores_as_transformers_does(presets_dir):
    """A vLLM node evaluates through its own engine: greedy on the warmed-up tiny-s gives the same per-problem
    hits as the transformers evaluation (fp32), on a split where the model gets some right and some wrong.
    Its engine starts after the previous test's closed: it must not be broken by that one's teardown."""
    from swarm_node.config import TaskConfig
    from swarm_node.evaluation import evaluate
    from swarm_node.tasks import get_task

    loaded = load_model("tiny-s", dtype="float32", device="cpu")
    task = get_task(TaskConfig())
    engine = started(loaded, GenerationConfig(backend="vllm", max_new_tokens=8, max_prompt_tokens=32,
                                              vllm={"kv_cache_gib": KV_GIB}))
    try:
        by_engine = evaluate(loaded.model, loaded.tokenizer, task, "id", 100, max_new_tokens=8, generator=engine)
    finally:
        engine.close()
        engine.close()  # idempotent: a node's close may run twice
    assert not hasattr(engine, "llm")
    by_hf = evaluate(loaded.model, loaded.tokenizer, task, "id", 100, max_new_tokens=8)
    assert 0.05 < by_hf["accuracy"] < 0.95
    assert by_engine["hits"] == by_hf["hits"]
