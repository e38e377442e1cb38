"""Generation backends: G completions per prompt with the behaviour log-probs they were sampled with.

`make_generator` picks the backend named by `generation.backend`; the node calls
`generator.sync_weights(model)` after each optimizer step (a no-op for transformers).
"""

from __future__ import annotations

from typing import Any

from swarm_node.generation.base import Generator, Sample

__all__ = ["Generator", "Sample", "make_generator"]


def make_generator(loaded_model: Any, gen_cfg: Any, *, engine_share: float | None = None,
                   sleep: bool = False) -> Generator:
    """Build the generator for a `LoadedModel` and a `GenerationConfig`. vLLM only: `engine_share` is the
    GPU share the memory plan gives the engine (when generation.vllm.gpu_memory_utilization is unset);
    `sleep` puts the engine to sleep during training steps (CUDA)."""
    tok = loaded_model.tokenizer
    if gen_cfg.backend == "transformers":
        from swarm_node.generation.hf import TransformersGenerator
        from swarm_node.generation.stops import stop_token_ids

        return TransformersGenerator(
            loaded_model.model,
            eos_token_id=stop_token_ids(loaded_model.model, tok),
            pad_token_id=tok.pad_token_id,
            batch_size=gen_cfg.batch_size,
        )
    if gen_cfg.backend == "vllm":
        from swarm_node.generation.vllm_backend import VLLMGenerator

        return VLLMGenerator.for_loaded_model(loaded_model, gen_cfg, engine_share=engine_share, sleep=sleep)
    raise ValueError(f"unknown generation.backend {gen_cfg.backend!r}; expected 'transformers' or 'vllm'")
