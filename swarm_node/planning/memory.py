"""The memory plan of a node: predicted peaks of sampling, of the training step and of the vLLM engine, and
whether they fit the device.

Training step (the trainer's device), in bytes, P parameters, A trained parameters (P for a full model, the
adapter's for LoRA), B = training.micro_batch_tokens:
- weights: 4 P (fp32 master weights) for a full model; the frozen base in the compute dtype + 4 A for LoRA;
- gradients 4 A, optimizer 8 A (Adam's two moments; SGD 0);
- autocast's copies of the weights in the compute dtype (measured by the probe, per layer) and of the head;
- activations: B x (layers x a + outside), a the probe's saved bytes per token of one layer; with
  gradient checkpointing, B x (layers x the layer's input + outside + a) (one layer recomputed);
- the backward's working set: one layer's activations again;
- the output head's chunk: c x V x (8 bytes: the fp32 logits and logsumexp's exp; 4 more for the division by
  T when T != 1, 4 more under autocast for the compute-dtype logits and their gradient), plus, for a full
  model, one chunk's gradient of the head's weight and the embedding's dense gradient before they are
  summed into the gradient (4 V H each);
- B counts the tokens a micro-batch's forwards run (padding included), so it bounds the activations
  whatever the prompt and completion lengths.
The bound assumes a later micro-batch of the step, whose activations sit beside the whole gradient.

Sampling (transformers backend, on the training model): weights, optimizer state, the KV cache of
generation.batch_size sequences at max_prompt_tokens + max_new_tokens, one prefill layer's intermediates and
the sampled position's fp32 logits. vLLM: an engine of its own, the weights in the compute dtype, the KV
cache of one round (prompts x G sequences) and a fixed overhead (CUDA graphs, the sampler); with sleep mode
(CUDA) the engine gives its memory back during the step, so the two phases do not add up.

Checked against measured peaks on CPU (docs/results/gpu-node.md, "A node's memory"), not yet on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swarm_node.config import NodeConfig
from swarm_node.planning.probe import ActivationCost
from swarm_node.planning.shape import ModelShape

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ENGINE_OVERHEAD = {"cuda": 1.5 * GIB, "cpu": 0.25 * GIB}  # vLLM: CUDA graphs, sampler tensors, activations
CUDA_CONTEXT = 0.5 * GIB  # the CUDA context and kernels, outside torch's allocator


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass
class MemoryPlan:
    """Predicted bytes, by part, and what they add up to on the device."""

    device: str                 # "cuda" or "cpu"
    device_bytes: int | None    # what the device has (None: unknown)
    compute: str                # compute dtype name
    shape: ModelShape
    train: dict[str, float] = field(default_factory=dict)
    sample: dict[str, float] = field(default_factory=dict)
    engine: dict[str, float] = field(default_factory=dict)
    engine_sleeps: bool = False

    @property
    def train_peak(self) -> float:
        return sum(self.train.values())

    @property
    def sample_peak(self) -> float:
        return sum(self.sample.values())

    @property
    def engine_total(self) -> float:
        return sum(self.engine.values())

    @property
    def peak(self) -> float:
        """The device's peak over a round. The transformers sampler shares the trainer's weights; a vLLM
        engine adds its own memory, during the step too unless it sleeps then."""
        context = CUDA_CONTEXT if self.device == "cuda" else 0.0
        if not self.engine:
            return context + max(self.train_peak, self.sample_peak)
        resident = self.train.get("weights", 0) + self.train.get("optimizer", 0)
        if self.engine_sleeps:
            return context + max(self.train_peak + ENGINE_OVERHEAD[self.device] / 3, resident + self.engine_total)
        return context + self.train_peak + self.engine_total

    @property
    def fits(self) -> bool | None:
        return None if self.device_bytes is None else self.peak <= self.device_bytes

    def engine_share(self) -> float:
        """vLLM's gpu_memory_utilization for this plan: the engine's part of the device."""
        if not self.device_bytes:
            return 0.35
        return min(0.95, max(0.05, round(self.engine_total / self.device_bytes + 0.01, 2)))

    def rows(self) -> list[tuple[str, str]]:
        """(part, size) lines of the plan, for printing."""
        out = [(f"training step: {k}", _gib(v)) for k, v in self.train.items()]
        out.append(("training step peak", _gib(self.train_peak)))
        if self.sample:
            out += [(f"sampling: {k}", _gib(v)) for k, v in self.sample.items()]
            out.append(("sampling peak", _gib(self.sample_peak)))
        if self.engine:
            out += [(f"vLLM engine: {k}", _gib(v)) for k, v in self.engine.items()]
            out.append(("vLLM engine", _gib(self.engine_total) + (" (sleeps during the step)" if self.engine_sleeps
                                                                  else " (beside the step)")))
        out.append(("device peak", _gib(self.peak)))
        return out


def plan_memory(cfg: NodeConfig, shape: ModelShape, cost: ActivationCost, device: str,
                device_bytes: int | None, compute: str) -> MemoryPlan:
    """The memory plan of `cfg` for a model of `shape` whose layer costs `cost` (the probe, measured under
    the same compute dtype and LoRA setting)."""
    t, g = cfg.training, cfg.generation
    cb = BYTES[compute]
    lora = cfg.model.lora.enabled
    trained = shape.adapter_params if lora else shape.params
    plan = MemoryPlan(device=device, device_bytes=device_bytes, compute=compute, shape=shape)
    base_bytes = cb if lora else 4
    weights = shape.params * base_bytes + (4 * trained if lora else 0)
    optimizer = {"adam": 8, "adamw": 8, "sgd": 0}[t.optimizer] * trained
    head_copy = shape.vocab * shape.hidden * cb if compute != "float32" and not lora else 0
    copies = shape.layers * cost.layer_fixed + head_copy
    tokens = t.micro_batch_tokens
    if t.gradient_checkpointing:
        acts = tokens * (shape.layers * cost.layer_input_per_token + cost.outside_per_token + cost.layer_per_token)
    else:
        acts = tokens * (shape.layers * cost.layer_per_token + cost.outside_per_token)
    chunk = min(t.logits_chunk_tokens or max(1, (128 * 2**20) // (4 * shape.vocab)), tokens)
    per_logit = 8 + (4 if g.temperature != 1.0 else 0) + (4 if compute != "float32" else 0)
    # full models: each chunk's head-weight gradient, then summed into the gradient; the embedding's dense
    # gradient likewise (one more for an untied head)
    head_grad = 0 if lora else 4 * shape.vocab * shape.hidden * (2 if shape.tied else 3)
    plan.train = {"weights": weights, "gradients": 4 * trained, "optimizer": optimizer,
                  "autocast copies": copies, "activations": acts,
                  "backward working set": tokens * cost.layer_per_token,
                  "output head chunk": chunk * shape.vocab * per_logit + head_grad}
    prompt = g.max_prompt_tokens
    context = prompt + g.max_new_tokens
    if shape.max_positions:
        context = min(context, shape.max_positions)
    if g.backend == "transformers":
        rows = min(g.batch_size, cfg.task.prompts_per_round * g.num_generations)
        plan.sample = {"weights": weights, "optimizer": optimizer, "autocast copies": copies,
                       "KV cache": rows * context * shape.kv_bytes_per_token(cb),
                       "prefill": min(rows, cfg.task.prompts_per_round) * prompt * (2 * shape.hidden + 3 * shape.intermediate) * cb,
                       "logits": rows * shape.vocab * 4 * 3}
    else:
        seqs = cfg.task.prompts_per_round * g.num_generations
        plan.engine = {"weights": shape.params * cb, "KV cache": seqs * context * shape.kv_bytes_per_token(cb),
                       "overhead": ENGINE_OVERHEAD[device]}
        if device == "cpu" and g.vllm.kv_cache_gib is not None:
            plan.engine["KV cache"] = g.vllm.kv_cache_gib * GIB
        plan.engine_sleeps = device == "cuda" and engine_sleeps(cfg)
    return plan


def engine_sleeps(cfg: NodeConfig) -> bool:
    """Whether the vLLM engine sleeps during the step: generation.vllm.sleep (None: yes, on a GPU), never
    with the pipeline (which samples while the step runs)."""
    v = cfg.generation.vllm
    return bool(v.sleep if v.sleep is not None else True) and not cfg.pipeline


@dataclass
class Advice:
    change: str        # a --set override
    plan: MemoryPlan   # the plan with it


def advise(cfg: NodeConfig, shape_for: Any, cost_for: Any, device: str, device_bytes: int, compute: str,
           plan: MemoryPlan) -> list[Advice]:
    """Settings that make a plan that does not fit fit, cheapest first: checkpointing, a smaller token
    budget, vLLM sleep, LoRA, shorter completions. `shape_for(lora)` and `cost_for(lora, ckpt)` give the
    shape and probe of a variant."""
    out: list[Advice] = []
    t = cfg.training

    def attempt(change: str, new_cfg: NodeConfig) -> MemoryPlan:
        lora = new_cfg.model.lora
        p = plan_memory(new_cfg, shape_for(lora), cost_for(lora), device, device_bytes, compute)
        if p.fits:
            out.append(Advice(change, p))
        return p

    def with_(section: str, **kw: Any) -> NodeConfig:
        return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=kw)})

    if not t.gradient_checkpointing:
        attempt("training.gradient_checkpointing=true", with_("training", gradient_checkpointing=True))
    budget = t.micro_batch_tokens // 2
    while budget >= 256:
        p = attempt(f"training.micro_batch_tokens={budget}", with_("training", micro_batch_tokens=budget))
        if p.fits:
            break
        budget //= 2
    if cfg.generation.backend == "vllm" and device == "cuda" and not plan.engine_sleeps:
        v = cfg.generation.vllm.model_copy(update={"sleep": True})
        attempt("generation.vllm.sleep=true (and pipeline=false)",
                with_("generation", vllm=v).model_copy(update={"pipeline": False}))
    if not cfg.model.lora.enabled:
        lora = cfg.model.lora.model_copy(update={"enabled": True, "r": 16, "alpha": 32})
        attempt("model.lora.enabled=true (r 16)", with_("model", lora=lora))
    for tokens in (cfg.generation.max_new_tokens // 2, cfg.generation.max_new_tokens // 4):
        if tokens >= 16:
            attempt(f"generation.max_new_tokens={tokens}", with_("generation", max_new_tokens=tokens))
    seen: set[str] = set()
    return [a for a in out if not (a.change in seen or seen.add(a.change))]


def describe(plan: MemoryPlan) -> str:
    """One line: predicted peak against the device."""
    have = _gib(plan.device_bytes) if plan.device_bytes else "unknown"
    verdict = {True: "fits", False: "does NOT fit", None: "(device size unknown)"}[plan.fits]
    return f"predicted peak {_gib(plan.peak)} on {plan.device} ({have}): {verdict}"


