"""`swarm-node plan`: the memory a GRPO node's config needs, part by part, and whether it fits the device.

Reads the model's config only (no weights), measures one layer's activations, and prints the predicted peaks
of sampling, the training step and the vLLM engine. Where the config does not fit it names the settings that
make it fit. `--measure` loads the model and runs two training steps on a full round of random tokens, and
prints the measured peak beside the prediction.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "plan"
HELP = "predict a node's peak memory (sampling, training step, vLLM engine) and whether the config fits"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", type=Path, help="YAML config file (default: built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, as for `swarm-node run`")
    p.add_argument("--gpu-memory", default=None, metavar="SIZE",
                   help="plan for a GPU of this size (e.g. 24GiB), whatever this machine has")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="plan for this device (default: where the node would run; --gpu-memory implies cuda)")
    p.add_argument("--measure", action="store_true",
                   help="also load the model and measure a training step's peak on this machine")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from swarm_node.config import load_config
    from swarm_node.planning import GIB, parse_size, plan_node
    from swarm_node.planning.memory import describe

    cfg = load_config(args.config, args.overrides)
    device = "cuda" if args.gpu_memory else (None if args.device == "auto" else args.device)
    size = parse_size(args.gpu_memory) if args.gpu_memory else None
    plan, advice = plan_node(cfg, device=device, device_bytes=size)
    out = {"model": cfg.model.path, "device": plan.device, "device_gib": plan.device_bytes and plan.device_bytes / GIB,
           "compute_dtype": plan.compute, "parameters": plan.shape.params,
           "trained_parameters": plan.shape.trained_params,
           "train_gib": {k: v / GIB for k, v in plan.train.items()}, "train_peak_gib": plan.train_peak / GIB,
           "sample_gib": {k: v / GIB for k, v in plan.sample.items()}, "sample_peak_gib": plan.sample_peak / GIB,
           "engine_gib": {k: v / GIB for k, v in plan.engine.items()}, "engine_sleeps": plan.engine_sleeps,
           "peak_gib": plan.peak / GIB, "fits": plan.fits,
           "advice": [{"set": a.change, "peak_gib": a.plan.peak / GIB} for a in advice]}
    if plan.engine and plan.device == "cuda":
        out["gpu_memory_utilization"] = plan.engine_share()
    if args.measure:
        out["measured"] = _measure(cfg)
        out["measured"]["predicted_train_peak_gib"] = plan.train_peak / GIB
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{cfg.model.path}: {plan.shape.params / 1e6:.1f}M parameters ({plan.shape.architecture}), "
          f"{plan.shape.trained_params / 1e6:.2f}M trained; compute {plan.compute} on {plan.device}")
    for part, size_text in plan.rows():
        print(f"  {part:<34} {size_text:>12}")
    if "gpu_memory_utilization" in out:
        print(f"  vLLM gpu_memory_utilization (when unset): {out['gpu_memory_utilization']}")
    print(describe(plan))
    for a in advice:
        print(f"  fits with --set {a.change}: peak {a.plan.peak / GIB:.2f} GiB")
    if args.measure:
        m = out["measured"]
        print(f"measured on {m['device']}: training step peak {m['peak_gib']:.2f} GiB "
              f"(predicted {plan.train_peak / GIB:.2f}), {m['seconds']} s")
    return 0


def _measure(cfg) -> dict:
    """Load the model as a node does, run a warm-up and a measured step on a full round of random tokens."""
    from swarm_node.models.loading import decoder_layers, load_model
    from swarm_node.planning import GIB
    from swarm_node.planning.measure import PeakMeter, measure_training_step, synthetic_groups
    from swarm_node.training.ftis_step import FTISTrainer

    g = cfg.generation
    device = "cuda" if cfg.model.device.startswith("cuda") else cfg.model.device
    meter = PeakMeter(device if device != "auto" else ("cuda" if _cuda() else "cpu"))
    lm = load_model(cfg.model.path, dtype=cfg.model.dtype, device=cfg.model.device, lora=cfg.model.lora)
    trainer = FTISTrainer(lm.model, cfg.training, lm.tokenizer.pad_token_id, lr_default=lm.default_lr(),
                          temperature=g.temperature,
                          checkpoint_layers=decoder_layers(lm.model) if cfg.training.gradient_checkpointing else (),
                          compute_dtype=lm.dtype)
    groups = synthetic_groups(cfg.task.prompts_per_round, g.num_generations, g.max_prompt_tokens,
                              g.max_new_tokens, lm.vocab_size)
    m = measure_training_step(trainer, groups, meter)
    ck = trainer.checkpointing
    return {"device": str(lm.device), "peak_gib": m["peak_bytes"] / GIB, "seconds": m["seconds"],
            "micro_batch_tokens": m["micro_batch_tokens"], "stepped": m["stepped"],
            "layer_forwards": ck.forwards if ck else 0, "layer_recomputations": ck.recomputed if ck else 0}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
