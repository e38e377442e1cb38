"""vLLM backend for GPU boxes (optional extra: `pip install 'swarm-node[vllm]'`).

Targets vLLM >= 0.10.2 (V1 engine), checked at start:
  * behaviour log-probs: `LLM(logprobs_mode="processed_logprobs")` makes the log-prob reported for each
    sampled token come from the distribution actually sampled from (after temperature). With top_k=0,
    top_p=1 and min_p=0 nothing truncates it, so it is the full-vocabulary log_softmax(logits / T) that
    F-TIS needs; `SamplingParams(logprobs=0)` returns just the sampled token's entry. Greedy requests
    (temperature 0) are reported at T=1, as in the transformers backend.
  * `generation_config="vllm"`: the checkpoint's generation_config.json (top_k/top_p defaults, extra
    stop tokens) is ignored, so sampling and EOS match the transformers backend exactly.
  * weight updates: the engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so
    `LLM.apply_model(fn)` calls `fn(model)` on the live vLLM model with no serialization, and
    `model.load_weights(iterable of (hf_name, tensor))` copies new weights in (fusing q/k/v etc. as when
    loading a checkpoint). The prefix cache is reset afterwards: cached KV came from the old weights.

Not exercised by the CPU test suite; only the missing-extra error is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from swarm_node.errors import UserFacingError
from swarm_node.generation.base import Generator, Sample

log = logging.getLogger(__name__)

MIN_VLLM = (0, 10, 2)
ENV_GPU_UTIL = "SWARM_NODE_VLLM_GPU_MEMORY_UTILIZATION"  # share of the GPU vLLM may take (training needs the rest)
ENV_MAX_LEN = "SWARM_NODE_VLLM_MAX_MODEL_LEN"            # cap the context so the KV cache fits


def import_vllm() -> Any:
    """Import vllm, or say clearly how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise UserFacingError(
            "generation.backend is 'vllm' but vLLM is not installed. Install the optional extra on a CUDA "
            "machine (pip install 'swarm-node[vllm]', vLLM >= 0.10.2), or set generation.backend=transformers"
        ) from exc
    found = _version_tuple(getattr(vllm, "__version__", "0"))
    if found < MIN_VLLM:
        raise UserFacingError(
            f"vLLM {vllm.__version__} is too old: the vllm backend needs >= {'.'.join(map(str, MIN_VLLM))} "
            "(logprobs_mode='processed_logprobs'); upgrade it or set generation.backend=transformers"
        )
    return vllm


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def hf_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) pairs of `model`, LoRA adapters folded in, the model left untouched.

    vLLM loads plain checkpoint weights, so a peft model's base weight is sent as W + delta (computed
    out of place: merging and unmerging in bf16 would drift the base weights a little every step).
    """
    if not hasattr(model, "get_base_model"):
        for name, tensor in model.state_dict().items():
            yield name, tensor.detach()
        return
    base = model.get_base_model()
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            yield name, tensor.detach()
            continue
        owner, suffix = name.split(".base_layer.", 1)
        module = base.get_submodule(owner)
        value = tensor.detach()
        if suffix == "weight" and not getattr(module, "merged", False):
            for adapter in module.active_adapters:
                if adapter in getattr(module, "lora_A", {}) or adapter in getattr(module, "lora_embedding_A", {}):
                    value = value + module.get_delta_weight(adapter).to(value.dtype)
        yield f"{owner}.{suffix}", value


class VLLMGenerator(Generator):
    """Sampling through an in-process vLLM engine loaded from `model_path`."""

    def __init__(
        self,
        model_path: str,
        *,
        eos_token_id: int,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.35,
        max_model_len: int | None = None,
        **engine_kwargs: Any,
    ) -> None:
        vllm = import_vllm()
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") not in (None, "0"):
            log.warning("overriding VLLM_ENABLE_V1_MULTIPROCESSING=1: weight updates need an in-process engine")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._vllm = vllm
        self.eos_token_id = int(eos_token_id)
        self.llm = vllm.LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            enable_prefix_caching=True,
            **engine_kwargs,
        )

    @classmethod
    def for_loaded_model(cls, loaded: Any) -> VLLMGenerator:
        """Engine for a `LoadedModel` on a CUDA device, holding the model's current weights."""
        import_vllm()
        if loaded.device.type != "cuda":
            raise UserFacingError(
                f"generation.backend 'vllm' needs a CUDA GPU, but the model is on {loaded.device}; "
                "set generation.backend=transformers"
            )
        dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[loaded.dtype]
        max_len = os.environ.get(ENV_MAX_LEN)
        gen = cls(
            loaded.path,
            eos_token_id=loaded.tokenizer.eos_token_id,
            dtype=dtype,
            gpu_memory_utilization=float(os.environ.get(ENV_GPU_UTIL, "0.35")),
            max_model_len=int(max_len) if max_len else None,
        )
        gen.sync_weights(loaded.model)  # the model may differ from the files (LoRA, resumed checkpoint)
        return gen

    def generate(
        self,
        prompts: list[list[int]],
        num_generations: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[list[Sample]]:
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        params = [
            self._vllm.SamplingParams(
                n=num_generations,
                temperature=0.0 if greedy else float(temperature),
                top_k=0,
                top_p=1.0,
                min_p=0.0,
                max_tokens=max_new_tokens,
                logprobs=0,
                # vLLM seeds the j-th of n children with seed + j, so prompts get disjoint seed ranges.
                seed=None if seed is None else int(seed) + i * num_generations,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [[self._sample(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]

    def _sample(self, completion: Any) -> Sample:
        tokens = np.asarray(completion.token_ids, dtype=np.int64)
        logprobs = np.asarray(
            [step[int(t)].logprob for step, t in zip(completion.logprobs, tokens, strict=True)], dtype=np.float32
        )
        finished = bool(len(tokens) and tokens[-1] == self.eos_token_id)
        return Sample(token_ids=tokens, logprobs=logprobs, finished=finished)

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (checkpoint name, tensor) pairs into the engine's model, then drop stale cached KV."""
        batch = list(weights)  # references to the training tensors; the engine is in this process
        self.llm.apply_model(lambda model: model.load_weights(batch))
        self.llm.reset_prefix_cache()

    def sync_weights(self, model: Any) -> None:
        self.update_weights(hf_weights(model))
