"""GPU smoke test of the real-checkpoint code paths (run where a CUDA GPU exists; no hub needed).

1. A randomly initialised model with Qwen2.5-0.5B's shape (151,936-token vocab, 24 layers) in bf16:
   batched sampling with the transformers backend (tokens/s), the behaviour log-probs against a
   teacher-forced recompute, one F-TIS optimizer step (peak memory, seconds), full and LoRA.
2. The same log-prob check in fp32 (TF32 off), where the CPU tests demand <= 1e-4.
3. A tiny-s GRPO node on the GPU (bf16 when supported) for a few rounds: accuracy before/after.
4. Both generation backends on the Qwen2.5-0.5B-shaped model in bf16, same prompts, G and max tokens:
   tokens/s, peak GPU memory, the vLLM weight-sync time after an optimizer step, and the gap between
   vLLM's behaviour log-probs and the trainer's recompute (bf16: reported, not asserted).

The one prepared command on a GPU machine (installs the CUDA torch and the [vllm] extra, then runs all):

    scripts/setup.sh dev,vllm && .venv/bin/python -m benchmarks.gpu_smoke --json OUT.json

`--only backends` runs just section 4.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from benchmarks.args import add_run_args, resolve_seeds, write_json


def qwen05b_shaped(dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True,
                      max_position_embeddings=4096, eos_token_id=151643, pad_token_id=151643)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to("cuda", dtype)


def sample_groups(model, prompts, g, max_new, temperature):
    from swarm_node.generation.hf import TransformersGenerator
    from swarm_node.training.groups import TrainGroup

    gen = TransformersGenerator(model, eos_token_id=151643, pad_token_id=151643, batch_size=64)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = gen.generate(prompts, g, max_new_tokens=max_new, temperature=temperature, seed=0)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for ss in out for s in ss)
    rng = np.random.default_rng(0)
    groups = [TrainGroup(prompt_ids=p, completions=[s.token_ids for s in ss],
                         behaviour_logprobs=[s.logprobs for s in ss],
                         rewards=rng.integers(0, 2, size=len(ss)).astype(np.float32)) for p, ss in zip(prompts, out, strict=True)]
    return groups, tokens, secs


def logprob_gap(trainer, groups) -> dict:
    recomputed = trainer.completion_logprobs(groups)
    diffs = np.concatenate([np.abs(r - b) for grp, rr in zip(groups, recomputed, strict=True)
                            for r, b in zip(rr, grp.behaviour_logprobs, strict=True)])
    return {"max_abs": float(diffs.max()), "mean_abs": float(diffs.mean())}


def section_big(dtype_name: str, lora: bool, res: dict) -> None:
    from swarm_node.config import LoraConfig, TrainingConfig
    from swarm_node.models.loading import wrap_lora
    from swarm_node.training.grpo_step import GRPOTrainer

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    model = qwen05b_shaped(dtype)
    if lora:
        model = wrap_lora(model, LoraConfig(enabled=True, r=16, alpha=32))
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 151000, size=int(n)).tolist() for n in rng.integers(20, 80, size=8)]
    groups, tokens, gen_s = sample_groups(model, prompts, 8, 128, 1.0)
    trainer = GRPOTrainer(model, TrainingConfig(variant="ftis", micro_batch_size=16, lr=1e-4 if lora else 1e-6),
                          151643)
    gap = logprob_gap(trainer, groups)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step = trainer.step(groups)
    torch.cuda.synchronize()
    changed = sum(int(not torch.equal(before[n], p)) for n, p in model.named_parameters() if p.requires_grad)
    res[f"qwen05b_{dtype_name}{'_lora' if lora else ''}"] = {
        "completion_tokens": tokens, "gen_s": round(gen_s, 3), "gen_tokens_per_s": round(tokens / gen_s, 1),
        "logprob_gap": gap, "step_s": round(time.perf_counter() - t0, 3), "stepped": step.stepped,
        "loss": step.loss, "grad_norm": step.grad_norm, "tensors_changed": changed,
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "finite": all(torch.isfinite(p).all().item() for p in model.parameters()),
    }
    del model, trainer
    torch.cuda.empty_cache()


def section_tiny_node(res: dict, rounds: int, seeds: list[int]) -> None:
    from benchmarks.nodes import heldout_score, node_config
    from swarm_node.node.grpo_node import GRPONode

    runs = []
    for seed in seeds:
        cfg = node_config("tiny-s", seed, training={"variant": "on_policy"})
        with tempfile.TemporaryDirectory() as d:
            node = GRPONode(cfg, Path(d))
            before = heldout_score(node).accuracy
            t0 = time.perf_counter()
            rows = [node.run_round() for _ in range(rounds)]  # (no periodic eval inside the rounds)
            secs = time.perf_counter() - t0
            after = heldout_score(node).accuracy
            runs.append({"seed": seed, "device": str(node.loaded.device), "dtype": str(node.loaded.dtype),
                         "rounds": rounds, "acc_before": before, "acc_after": after,
                         "s_per_round": round(secs / rounds, 3),
                         "gen_s": float(np.mean([r["gen_s"] for r in rows])),
                         "train_s": float(np.mean([r["train_s"] for r in rows]))})
    res["tiny_s_node_cuda"] = runs[0] if len(runs) == 1 else runs


def section_backends(res: dict, p_n: int = 32, g: int = 8, max_new: int = 128) -> None:
    """transformers vs vLLM in bf16 on one model: tokens/s and peak memory, then a step + weight sync."""
    from swarm_node.config import GenerationConfig, TrainingConfig
    from swarm_node.generation.hf import TransformersGenerator
    from swarm_node.generation.vllm_backend import VLLMGenerator
    from swarm_node.models.factory import build_tokenizer
    from swarm_node.models.loading import load_model
    from swarm_node.training.grpo_step import GRPOTrainer

    tok = build_tokenizer()
    with tempfile.TemporaryDirectory() as d:
        qwen05b_shaped(torch.bfloat16).save_pretrained(d)
        tok.save_pretrained(d)  # prompts use the char tokenizer's ids, a subset of the model's vocab
        torch.cuda.empty_cache()
        loaded = load_model(d, dtype="bfloat16", device="cuda")
        rng = np.random.default_rng(2)
        prompts = [rng.integers(3, len(tok), size=int(n)).tolist() for n in rng.integers(20, 80, size=p_n)]
        out: dict = {"P": p_n, "G": g, "max_new_tokens": max_new}
        hf = TransformersGenerator(loaded.model, eos_token_id=151643, pad_token_id=tok.pad_token_id, batch_size=p_n * g)
        hf.generate(prompts[:2], 2, max_new_tokens=8, seed=0)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        o = hf.generate(prompts, g, max_new_tokens=max_new, seed=1)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        n = sum(len(s.token_ids) for ss in o for s in ss)
        out["transformers"] = {"tokens": n, "s": round(secs, 3), "tokens_per_s": round(n / secs, 1),
                               "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        vg = VLLMGenerator.for_loaded_model(loaded, GenerationConfig(backend="vllm", max_new_tokens=max_new,
                                                                     max_prompt_tokens=128))
        out["vllm_start_s"] = round(time.perf_counter() - t0, 1)
        vg.stop_token_ids = [151643]
        vg.generate(prompts[:2], 2, max_new_tokens=8, seed=0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o = vg.generate(prompts, g, max_new_tokens=max_new, seed=1)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        n = sum(len(s.token_ids) for ss in o for s in ss)
        free, total = torch.cuda.mem_get_info()
        out["vllm"] = {"tokens": n, "s": round(secs, 3), "tokens_per_s": round(n / secs, 1),
                       "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                       "gpu_used_gib": round((total - free) / 2**30, 2)}
        out["ratio_vllm_over_transformers"] = round(out["vllm"]["tokens_per_s"] / out["transformers"]["tokens_per_s"], 2)
        from swarm_node.training.groups import TrainGroup

        groups = [TrainGroup(prompt_ids=np.asarray(p), completions=[s.token_ids for s in ss],
                             behaviour_logprobs=[s.logprobs for s in ss],
                             rewards=rng.integers(0, 2, size=len(ss)).astype(np.float32))
                  for p, ss in zip(prompts[:8], o[:8], strict=True)]
        trainer = GRPOTrainer(loaded.model, TrainingConfig(variant="ftis", micro_batch_size=16, lr=1e-6),
                              tok.pad_token_id)
        out["vllm_logprob_gap_bf16"] = logprob_gap(trainer, groups)
        trainer.step(groups)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        vg.sync_weights(loaded.model)
        torch.cuda.synchronize()
        out["vllm_sync_s"] = round(time.perf_counter() - t0, 3)
        res["backends_bf16"] = out
        del vg, hf, trainer, loaded
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=1, first_seed=1, quick="the tiny node for 5 rounds",
                 seeds_help="tiny-s node runs (section 3), seeds from --seed on")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of the tiny-s node (5 with --quick)")
    ap.add_argument("--only", choices=["bf16", "bf16_lora", "fp32", "tiny_node", "backends"], default=None)
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.rounds = 5
    assert torch.cuda.is_available(), "this smoke test needs a CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "bf16_supported": torch.cuda.is_bf16_supported()}
    for name, fn in (("bf16", lambda: section_big("bf16", False, res)),
                     ("bf16_lora", lambda: section_big("bf16", True, res)),
                     ("fp32", lambda: section_big("fp32", False, res)),
                     ("tiny_node", lambda: section_tiny_node(res, args.rounds, seeds)),
                     ("backends", lambda: section_backends(res))):
        if args.only and name != args.only:
            continue
        try:
            fn()
        except Exception:
            res[f"error_{name}"] = traceback.format_exc()[-2000:]
        print(json.dumps(res, indent=1, default=str), flush=True)
    write_json(args.json, res, args)


if __name__ == "__main__":
    main()
