"""swarm-node's GRPO node beside TRL's GRPOTrainer on SmolLM2-135M-Instruct: time per step, peak memory and
held-out accuracy after N steps, the same model, prompts and settings, in one run.

Both arms train the full model alone for N steps on the same prompts: step r uses the prompts that
peers/smollm2-135m.yaml's node draws in round r (chat form), G completions each, the same max new tokens,
temperature 1 (no top-k/top-p), learning rate, Adam(W) without weight decay, grad clip 1.0, one optimizer
step per batch, no KL term (TRL beta = 0), TRL's loss_type "grpo" (per-sequence token mean, then the batch
mean: swarm-node's normalisation) and group-scaled advantages. TRL samples with its own `model.generate`,
swarm-node with its generator; rewards are the task's own in both. Differences the APIs leave: swarm-node
skips zero-advantage groups (TRL keeps them at advantage 0, which only rescales its mean) and applies the
F-TIS ratio, which is 1 on its own samples.

Each arm runs in its own process, one after the other (so each peak RSS is its own), with the same torch
thread count; both end models are scored with the node's own evaluation (its PromptEncoder, so the chat
template is applied) on the same held-out problems, paired per problem.

    python -m benchmarks.real_trl --steps 8 --json real_trl.json
    python -m benchmarks.real_trl --quick

Needs TRL beside swarm-node (`pip install trl==1.16.0`, or the `bench` extra); without it the TRL arm is
skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "peers" / "smollm2-135m.yaml"


def node_config(args: argparse.Namespace):
    from swarm_node.config import load_config

    return load_config(PEER, [f"seed={args.seed}", "swarm.enabled=false", "rounds=null",  # no eval inside a step
                              f"task.prompts_per_round={args.prompts}", f"task.eval_n={args.eval_n}",
                              f"generation.num_generations={args.g}", f"generation.max_new_tokens={args.max_new}",
                              "metrics.eval_every=100000"])


def evaluate_model(model, tokenizer, cfg) -> tuple[float, list[bool]]:
    """The node's own held-out scoring (evaluation.score_prompts through its PromptEncoder)."""
    from swarm_node.evaluation import score_prompts
    from swarm_node.generation.prompts import PromptEncoder, chat_template_setting
    from swarm_node.tasks import get_task

    task = get_task(cfg.task)
    enc = PromptEncoder(tokenizer, chat_template_setting(cfg.generation.chat_template, cfg.task.prompt_form),
                        cfg.generation.max_prompt_tokens)
    hits, _ = score_prompts(model, tokenizer, task, task.eval_prompts(cfg.task.eval_split, cfg.task.eval_n),
                            cfg.generation.max_new_tokens, batch_size=64, encode=enc.encode)
    return float(np.mean(hits)), hits


def arm_ours(args: argparse.Namespace) -> dict:
    from swarm_node.grpo.round import GRPONode

    cfg = node_config(args)
    with tempfile.TemporaryDirectory() as tmp:
        node = GRPONode(cfg, Path(tmp))
        steps = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            row = node.run_round()
            steps.append({"seconds": time.perf_counter() - t0, "stepped": row["stepped"], "split": row["time_split_s"],
                          "reward": row["reward_mean"]})
        acc, hits = evaluate_model(node.loaded.model, node.tok, cfg)
        node.close()
    return {"steps": steps, "accuracy": acc, "hits": hits}


def trl_inputs(cfg, steps: int) -> tuple:
    """What TRL's GRPOTrainer needs to train on a node's rounds: the dataset of rounds 1..steps' prompts
    (exactly what GRPONode._rng(r) draws, as chat messages), the task's own reward, and a callback that
    appends each step's seconds to the returned list."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from swarm_node.tasks import get_task

    task = get_task(cfg.task)
    rounds = [task.train_prompts(cfg.task.prompts_per_round, np.random.default_rng([cfg.seed, cfg.task.seed, r]))
              for r in range(1, steps + 1)]
    flat = [p for ps in rounds for p in ps]
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p.text}] for p in flat],
                              "prompt_id": [p.id for p in flat]})

    def reward(completions, prompt_id, **_kw) -> list[float]:
        return [task.reward(task.prompt_from_id(pid), c[0]["content"]) for c, pid in zip(completions, prompt_id,
                                                                                          strict=True)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *_a, **_k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_a, **_k):
            times.append(time.perf_counter() - self.t0)

    return data, reward, Timer(), times


def arm_trl(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from swarm_node.models.factory import ensure_preset

    cfg = node_config(args)
    data, reward, timer, times = trl_inputs(cfg, args.steps)
    path = str(ensure_preset("smollm2-135m"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = cfg.generation
    with tempfile.TemporaryDirectory() as tmp:
        targs = GRPOConfig(
            output_dir=tmp, use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1,
            seed=cfg.seed, max_steps=args.steps, per_device_train_batch_size=cfg.task.prompts_per_round * g.num_generations,
            gradient_accumulation_steps=1, num_generations=g.num_generations, max_completion_length=g.max_new_tokens,
            temperature=g.temperature, top_p=1.0, top_k=0, learning_rate=args.lr, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=0.0, max_grad_norm=cfg.training.grad_clip, beta=0.0, num_iterations=1,
            loss_type="grpo", scale_rewards="group", shuffle_dataset=False, disable_dropout=True,
            dataloader_num_workers=0)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=targs, train_dataset=data, processing_class=tok,
                              callbacks=[timer])
        trainer.train()
    model.eval()
    acc, hits = evaluate_model(model, tok, cfg)
    return {"steps": [{"seconds": s} for s in times], "accuracy": acc, "hits": hits}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = arm_ours(args) if args.arm == "ours" else arm_trl(args)
    out["wall_s"] = time.perf_counter() - t0
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    args.out.write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=1, quick="2 steps, 2 prompts x 4, n=40",
                 seeds_help="one seed a run (each arm is its own minutes-long process): run again with --seed S")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--g", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--lr", type=float, default=None, help="default: the preset's full-model rate")
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arm", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if len(resolve_seeds(args)) != 1:
        raise SystemExit(f"real_trl runs one seed a run, got --seeds {args.seeds}: run it again with --seed S")
    if args.quick:
        args.steps, args.prompts, args.g, args.eval_n = 2, 2, 4, 40
    if args.lr is None:
        from swarm_node.models.presets import PACKAGED

        args.lr = PACKAGED["smollm2-135m"].lr_full
    if args.arm:
        return child(args)
    try:
        import trl  # noqa: F401
        arms = ["ours", "trl"]
    except ImportError:
        arms = ["ours"]
        print("note: trl not installed (pip install trl==1.16.0): only the swarm-node arm runs", flush=True)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in arms:
            out = Path(tmp) / f"{arm}.json"
            cmd = [sys.executable, "-m", "benchmarks.real_trl", "--arm", arm, "--out", str(out)] + [
                a for k, v in (("--steps", args.steps), ("--seed", args.seed), ("--prompts", args.prompts),
                               ("--g", args.g), ("--max-new", args.max_new), ("--lr", args.lr),
                               ("--eval-n", args.eval_n), ("--threads", args.threads)) for a in (k, str(v))]
            print(f"[{arm}] {' '.join(cmd[3:])}", flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT)
            res[arm] = json.loads(out.read_text())
    from swarm_node.runs.stats import paired_se, verdict

    print(f"\nSmolLM2-135M-Instruct, full parameters, {args.steps} steps of {args.prompts} prompts x {args.g}, "
          f"{args.max_new} new tokens, lr {args.lr:g}, seed {args.seed}, {args.threads} thread(s), held-out n={args.eval_n}\n")
    print(f"{'arm':10s} {'s/step (all)':>13s} {'s/step (2nd on)':>16s} {'peak RSS GiB':>13s} {'accuracy':>9s}")
    for arm, r in res.items():
        s = [x["seconds"] for x in r["steps"]]
        later = s[1:] or s
        print(f"{arm:10s} {np.mean(s):13.2f} {np.mean(later):16.2f} {r['peak_rss_gib']:13.2f} {r['accuracy']:9.3f}")
    if "trl" in res:
        a, b = res["trl"], res["ours"]
        ratio = np.mean([x["seconds"] for x in a["steps"][1:] or a["steps"]]) / np.mean(
            [x["seconds"] for x in b["steps"][1:] or b["steps"]])
        d, se = a["accuracy"] - b["accuracy"], paired_se(a["hits"], b["hits"])
        print(f"\nTRL / swarm-node: time per step x{ratio:.2f}, peak memory x{a['peak_rss_gib'] / b['peak_rss_gib']:.2f}, "
              f"accuracy {d:+.3f} +- {se:.3f} ({verdict(d, se)})")
        res["ratios"] = {"time_per_step": ratio, "peak_rss": a["peak_rss_gib"] / b["peak_rss_gib"], "accuracy_diff": d,
                         "accuracy_se": se}
    write_json(args.json, {"args": public_args(args, drop=("arm", "out")), **res}, args)


if __name__ == "__main__":
    main()
