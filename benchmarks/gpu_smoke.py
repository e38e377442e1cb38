"""GPU acceptance of a node on one's own GPU: asserted gates on random-init models of real shapes (no hub).

The one prepared command on a machine with an NVIDIA GPU (driver >= 580), from a clean clone:

    scripts/setup.sh dev,vllm,bench && .venv/bin/python -m benchmarks.gpu_smoke --json gpu_smoke.json

It builds a stand-in of Qwen2.5-0.5B-Instruct (models/standins.py: the real config and vocabulary, random
weights) and runs, printing a table and exiting 1 if a gate fails (well under 10 minutes on one H100):
1. master_weights: the model in bf16 compute, lr 1e-6, one F-TIS step on its own samples: the share of weight
   elements that moved (gate >= 0.9; Adam on bf16 weights moved 0.9% at this rate on CPU).
2. logprob_gap_hf: the transformers sampler's behaviour log-probs at T = 0.7 against the trainer's recompute
   (gates: mean |gap| <= 0.02 nats, and <= 1% of tokens with a ratio outside [1/2, 2], F-TIS's truncation).
3. plan: the memory plan of peers/qwen2.5-0.5b-instruct.yaml's training step against
   torch.cuda.max_memory_allocated, with and without gradient checkpointing (gate: within 25%).
4. vllm: a sleeping engine (the node's sleep mode): the same log-prob gap against vLLM's sampler (gates as 2),
   the memory a sleep gives back (gate >= 50% of what the engine held), the seconds of sleep, wake and the
   weight sync after a step, and the gap again after the sync (gate as 2: the engine took the new weights).
5. node_round: two rounds of peers/qwen2.5-0.5b-instruct.yaml on the stand-in, alone, training on every group
   (random weights score 0, so no group would carry a signal): seconds per phase, the engine's seconds, the
   device's peak against the plan's (gate: both rounds stepped, no out-of-memory retry).
6. trl: the same round with TRL's GRPOTrainer, vLLM colocated with sleep mode, same model, prompts, G and
   lengths, bf16, gradient checkpointing: seconds per step beside ours (reported, no gate; needs the bench
   extra).

`--only NAME` runs one section; `--quick` shortens completions to 128 tokens.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "peers" / "qwen2.5-0.5b-instruct.yaml"
TEMPERATURE = 0.7
GAP_MEAN, GAP_OUTSIDE = 0.02, 0.01


def gap_stats(groups, recomputed) -> dict:
    d = np.concatenate([r - b for g, rr in zip(groups, recomputed, strict=True)
                        for r, b in zip(rr, g.behaviour_logprobs, strict=True)])
    return {"tokens": int(d.size), "mean_abs": float(np.abs(d).mean()), "max_abs": float(np.abs(d).max()),
            "outside_half_two": float(np.mean(np.abs(d) > np.log(2)))}


def gap_gate(stats: dict) -> bool:
    return stats["mean_abs"] <= GAP_MEAN and stats["outside_half_two"] <= GAP_OUTSIDE


def sample_round(generator, cfg, prompts, max_new: int, seed: int):
    """The round's G completions per prompt at the gap temperature, as groups with mixed rewards."""
    out = generator.generate(prompts, cfg.generation.num_generations, max_new_tokens=max_new,
                             temperature=TEMPERATURE, seed=seed)
    return as_groups(prompts, out)


def as_groups(prompts, out, seed: int = 0):
    from swarm_node.training.groups import TrainGroup

    rng = np.random.default_rng(seed)
    return [TrainGroup(prompt_ids=np.asarray(p), completions=[s.token_ids for s in ss],
                       behaviour_logprobs=[s.logprobs for s in ss],
                       rewards=rng.permutation(np.arange(len(ss)) % 2).astype(np.float32))
            for p, ss in zip(prompts, out, strict=True)]


def node_cfg(model_dir: Path, *overrides: str):
    from swarm_node.config import load_config

    return load_config(PEER, [f"model.path={model_dir}", "swarm.enabled=false", "rounds=null",
                              "metrics.eval_every=1000000", *overrides])


def round_prompts(cfg, loaded):
    """Round 1's prompts as the node encodes them (chat form)."""
    from swarm_node.generation.prompts import PromptEncoder, chat_template_setting
    from swarm_node.tasks import get_task

    task = get_task(cfg.task)
    enc = PromptEncoder(loaded.tokenizer, chat_template_setting(cfg.generation.chat_template, cfg.task.prompt_form),
                        cfg.generation.max_prompt_tokens)
    ps = task.train_prompts(cfg.task.prompts_per_round, np.random.default_rng([cfg.seed, cfg.task.seed, 1]))
    return [enc.encode(p.text) for p in ps]


def trainer_for(cfg, loaded):
    from swarm_node.models.loading import decoder_layers
    from swarm_node.training.ftis_step import FTISTrainer

    return FTISTrainer(loaded.model, cfg.training, loaded.tokenizer.pad_token_id, lr_default=loaded.default_lr(),
                       temperature=cfg.generation.temperature, compute_dtype=loaded.dtype,
                       checkpoint_layers=decoder_layers(loaded.model) if cfg.training.gradient_checkpointing else ())


def section_master_weights_and_hf_gap(model_dir: Path, res: dict, gates: dict, max_new: int) -> None:
    import torch

    from swarm_node.generation import make_generator
    from swarm_node.models.loading import load_model

    cfg = node_cfg(model_dir, "generation.backend=transformers", f"generation.max_new_tokens={max_new}",
                   f"generation.temperature={TEMPERATURE}", "training.lr=1e-6")
    loaded = load_model(str(model_dir), dtype="bfloat16", device="cuda")
    gen = make_generator(loaded, cfg.generation)
    prompts = round_prompts(cfg, loaded)
    groups = sample_round(gen, cfg, prompts, max_new, seed=0)
    trainer = trainer_for(cfg, loaded)
    gap = gap_stats(groups, trainer.completion_logprobs(groups))
    before = [p.detach().clone() for p in loaded.model.parameters()]
    step = trainer.step(groups)
    moved = sum(int((a != b).sum()) for a, b in zip(before, loaded.model.parameters(), strict=True))
    share = moved / sum(b.numel() for b in before)
    res["master_weights"] = {"stepped": step.stepped, "moved_share": share,
                             "trained_dtype": str(next(loaded.model.parameters()).dtype)}
    res["logprob_gap_hf"] = gap
    gates["master_weights: >= 90% of weights move at lr 1e-6 (bf16 compute)"] = step.stepped and share >= 0.9
    gates[f"logprob_gap_hf: mean <= {GAP_MEAN}, outside [1/2, 2] <= {GAP_OUTSIDE:.0%}"] = gap_gate(gap)
    del loaded, gen, trainer, before
    torch.cuda.empty_cache()


def section_plan(model_dir: Path, res: dict, gates: dict) -> None:
    import torch

    from swarm_node.models.loading import load_model
    from swarm_node.planning import plan_node
    from swarm_node.planning.measure import PeakMeter, measure_training_step, synthetic_groups

    out = {}
    for ckpt in (True, False):
        cfg = node_cfg(model_dir, f"training.gradient_checkpointing={str(ckpt).lower()}")
        plan, _ = plan_node(cfg, device="cuda")
        torch.cuda.empty_cache()
        meter = PeakMeter("cuda")
        loaded = load_model(str(model_dir), dtype=cfg.model.dtype, device="cuda")
        g = cfg.generation
        groups = synthetic_groups(cfg.task.prompts_per_round, g.num_generations, g.max_prompt_tokens, g.max_new_tokens,
                                  loaded.vocab_size)
        m = measure_training_step(trainer_for(cfg, loaded), groups, meter)
        ratio = plan.train_peak / m["peak_bytes"]
        out["checkpointing" if ckpt else "plain"] = {"predicted_gib": plan.train_peak / 2**30,
                                                     "measured_gib": m["peak_bytes"] / 2**30, "ratio": ratio,
                                                     "step_s": m["seconds"]}
        gates[f"plan: training step within 25% of the measured peak ({'checkpointing' if ckpt else 'plain'})"] = \
            0.75 <= ratio <= 1.25
        del loaded
        torch.cuda.empty_cache()
    res["plan"] = out


def section_vllm(model_dir: Path, res: dict, gates: dict, max_new: int) -> None:
    import torch

    from swarm_node.generation import make_generator
    from swarm_node.models.loading import load_model
    from swarm_node.planning import plan_node

    cfg = node_cfg(model_dir, f"generation.max_new_tokens={max_new}", f"generation.temperature={TEMPERATURE}")
    plan, _ = plan_node(cfg, device="cuda")
    loaded = load_model(str(model_dir), dtype="bfloat16", device="cuda")
    t0 = time.perf_counter()
    engine = make_generator(loaded, cfg.generation, engine_share=plan.engine_share(), sleep=True)
    start_s = time.perf_counter() - t0
    prompts = round_prompts(cfg, loaded)
    groups = sample_round(engine, cfg, prompts, max_new, seed=0)
    trainer = trainer_for(cfg, loaded)
    gap = gap_stats(groups, trainer.completion_logprobs(groups))
    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    engine.release()
    free_asleep = torch.cuda.mem_get_info()[0]
    step = trainer.step(groups)
    engine.resume(loaded.model, changed=step.stepped)
    groups2 = sample_round(engine, cfg, prompts, max_new, seed=1)
    gap_after = gap_stats(groups2, trainer.completion_logprobs(groups2))
    freed = (free_asleep - free_awake) / 2**30
    engine_gib = plan.engine_total / 2**30
    res["vllm"] = {"start_s": start_s, "engine_share": plan.engine_share(), "gap": gap, "gap_after_sync": gap_after,
                   "freed_by_sleep_gib": freed, "engine_planned_gib": engine_gib, "seconds": dict(engine.seconds)}
    gates[f"vllm: sampler gap mean <= {GAP_MEAN}, outside [1/2, 2] <= {GAP_OUTSIDE:.0%}"] = gap_gate(gap)
    gates["vllm: sleep gives back >= 50% of the engine's planned memory"] = freed >= 0.5 * engine_gib
    gates["vllm: after wake and sync, the gap holds (the engine took the new weights)"] = step.stepped and gap_gate(gap_after)
    del engine, loaded, trainer
    torch.cuda.empty_cache()


def section_node_round(model_dir: Path, res: dict, gates: dict, max_new: int) -> dict:
    import torch

    from swarm_node.grpo.round import GRPONode

    # random weights score 0 on every sample: train on zero-advantage groups too, so the step runs as a real one
    cfg = node_cfg(model_dir, f"generation.max_new_tokens={max_new}", "training.skip_zero_advantage_groups=false")
    torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp:
        node = GRPONode(cfg, Path(tmp))
        rows = []
        for _ in range(2):
            t0 = time.perf_counter()
            row = node.run_round()
            rows.append({"seconds": time.perf_counter() - t0, "stepped": row["stepped"],
                         "split": row.get("time_split_s"), "engine_s": row.get("engine_s"),
                         "oom_retries": row.get("oom_retries"), "tokens_per_s": row.get("tokens_per_s")})
        planned = node.plan.peak / 2**30 if node.plan else None
        node.close()
    out = {"rounds": rows, "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30, "planned_peak_gib": planned}
    res["node_round"] = out
    gates["node_round: two rounds stepped with no out-of-memory retry"] = all(
        r["stepped"] and not r["oom_retries"] for r in rows)
    torch.cuda.empty_cache()
    return out


def section_trl(model_dir: Path, res: dict, max_new: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.real_trl import trl_inputs

    cfg = node_cfg(model_dir, f"generation.max_new_tokens={max_new}")
    steps = 2
    data, reward, timer, times = trl_inputs(cfg, steps)
    g = cfg.generation
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        targs = GRPOConfig(
            output_dir=tmp, bf16=True, report_to=[], save_strategy="no", logging_steps=1, seed=cfg.seed,
            max_steps=steps, per_device_train_batch_size=cfg.task.prompts_per_round * g.num_generations,
            gradient_accumulation_steps=1, num_generations=g.num_generations, max_completion_length=g.max_new_tokens,
            temperature=g.temperature, top_p=1.0, top_k=0, learning_rate=1e-6, lr_scheduler_type="constant",
            beta=0.0, num_iterations=1, loss_type="grpo", shuffle_dataset=False, gradient_checkpointing=True,
            use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True, vllm_gpu_memory_utilization=0.3)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=targs, train_dataset=data, processing_class=tok,
                              callbacks=[timer])
        trainer.train()
    res["trl"] = {"steps_s": times, "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
    ours = res.get("node_round", {}).get("rounds", [])
    if ours and times:
        res["trl"]["ours_over_trl_s"] = float(np.mean([r["seconds"] for r in ours[1:] or ours]) / np.mean(times[1:] or times))
    del trainer, model
    torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=1, quick="completions of 128 tokens (the config's 512 otherwise)",
                 seeds_help="one seed (the stand-in's weights)")
    ap.add_argument("--only", choices=["master_weights", "plan", "vllm", "node_round", "trl"], default=None)
    args = ap.parse_args()
    resolve_seeds(args)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu_smoke needs a CUDA GPU (scripts/setup.sh dev,vllm,bench on a GPU machine)")
    from swarm_node.models.standins import build_standin

    max_new = 128 if args.quick else 512
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": public_args(args)}
    gates: dict[str, bool] = {}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen2.5-0.5b-instruct"
        res["standin"] = build_standin("qwen2.5-0.5b-instruct", model_dir, seed=args.seed)
        sections = {"master_weights": lambda: section_master_weights_and_hf_gap(model_dir, res, gates, max_new),
                    "plan": lambda: section_plan(model_dir, res, gates),
                    "vllm": lambda: section_vllm(model_dir, res, gates, max_new),
                    "node_round": lambda: section_node_round(model_dir, res, gates, max_new),
                    "trl": lambda: section_trl(model_dir, res, max_new)}
        for name, fn in sections.items():
            if args.only and name != args.only:
                continue
            t0 = time.perf_counter()
            try:
                fn()
            except ImportError as exc:
                res[f"skipped_{name}"] = str(exc)
            except Exception:
                res[f"error_{name}"] = traceback.format_exc()[-3000:]
                gates[f"{name}: ran without an error"] = False
            res.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
            print(json.dumps({k: res[k] for k in res if k.startswith(name) or k.endswith(name)}, default=str), flush=True)
    res["wall_s"] = round(time.perf_counter() - t_all, 1)
    res["gates"] = gates
    print(f"\n{res['gpu']}, torch {res['torch']}, {res['wall_s']} s")
    for gate, ok in gates.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {gate}")
    write_json(args.json, res, args)
    return 0 if all(gates.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
