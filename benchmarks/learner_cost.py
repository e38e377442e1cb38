"""What the F-TIS learner costs: its gradient pass against on-policy GRPO, a plain forward+backward over the
same tokens (the floor), and TRL's GRPOTrainer.compute_loss on the same model and batch, as ratios.

One real batch per seed: the model samples G completions for P arithmetic prompts (swarm_node's own
generator, behaviour log-probs included), rewards are the task's. Each arm computes the loss and its
gradient over exactly those sequences; the optimizer step is left out, since it is the same for all.
Arms are timed round-robin (so a busy machine slows them alike) and the median of --repeats is kept.

    python -m benchmarks.learner_cost --seeds 3
    python -m benchmarks.learner_cost --quick

TRL is not a dependency of swarm-node: install it in the benchmark's environment (`pip install trl==1.16.0`)
or the TRL column is skipped with a note.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from swarm_node.grpo.round import GRPONode
from swarm_node.runs.stats import fmt_ms, mean_std
from swarm_node.training.ftis_step import FTISTrainer, PreparedBatch
from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json
from tooling.benchmark_nodes import grpo_node, node_config


def make_node(model: str, seed: int, prompts: int, g: int, max_new: int, workdir: Path) -> GRPONode:
    training = {"variant": "ftis", "skip_zero_advantage_groups": False, "micro_batch_size": prompts * g}
    return grpo_node(node_config(model, seed, prompts=prompts, generations=g, max_new_tokens=max_new,
                                 training=training), workdir)


def floor_pass(trainer: FTISTrainer, batch: PreparedBatch) -> None:
    """The same forward over the same padded sequences and a trivial loss: what any learner must pay."""
    trainer.optimizer.zero_grad(set_to_none=True)
    logp, mask, _ = trainer._forward_logp(batch.sequences)
    (-(logp * mask).sum() / mask.sum()).backward()


def trl_arm(node: GRPONode, batch: PreparedBatch) -> Callable[[], None] | str:
    """TRL's GRPO loss (its default loss_type) on the same sequences: prompts left-padded, completions right-padded."""
    try:
        from datasets import Dataset
        from trl import GRPOConfig
        from trl import GRPOTrainer as TRLTrainer
    except ImportError:
        return "trl not installed (pip install trl==1.16.0)"
    tok, model = node.tok, node.loaded.model
    seqs = batch.sequences
    g = node.cfg.generation.num_generations
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=len(seqs), num_generations=g,
                      use_cpu=True, report_to=[], bf16=False, max_completion_length=node.cfg.generation.max_new_tokens,
                      logging_steps=10**9)
    trainer = TRLTrainer(model=model, args=args, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                         train_dataset=Dataset.from_dict({"prompt": ["x"] * len(seqs)}), processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step, which we bypass
    pad = tok.pad_token_id
    pmax = max(s.prompt_len for s in seqs)
    cmax = max(s.completion_len for s in seqs)
    prompt_ids = torch.full((len(seqs), pmax), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(seqs), pmax), dtype=torch.long)
    comp_ids = torch.full((len(seqs), cmax), pad, dtype=torch.long)
    comp_mask = torch.zeros((len(seqs), cmax), dtype=torch.long)
    for i, s in enumerate(seqs):
        p, c = s.prompt_len, s.completion_len
        prompt_ids[i, pmax - p:] = torch.from_numpy(s.ids[:p])
        prompt_mask[i, pmax - p:] = 1
        comp_ids[i, :c] = torch.from_numpy(s.ids[p:])
        comp_mask[i, :c] = 1
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": comp_ids,
              "completion_mask": comp_mask, "advantages": torch.tensor([s.advantage for s in seqs]),
              "num_items_in_batch": comp_mask.sum().float()}

    def run() -> None:
        model.zero_grad(set_to_none=True)
        trainer.compute_loss(model, inputs).backward()
    return run


def measure(model: str, seed: int, args: argparse.Namespace, workdir: Path) -> dict:
    node = make_node(model, seed, args.prompts, args.g, args.max_new, workdir / f"s{seed}")
    groups = node.generate(1).train_groups()
    external = node.generate(2).train_groups(source="peer")  # F-TIS: half the groups from "another policy"
    trainers = {v: FTISTrainer(node.loaded.model, node.cfg.training.model_copy(update={"variant": v}),
                               node.tok.pad_token_id) for v in ("ftis", "on_policy")}
    batch = trainers["ftis"].prepare(groups + external)
    arms: dict[str, Callable[[], None]] = {
        "ftis": lambda: trainers["ftis"].accumulate_gradients(batch),
        "on_policy": lambda: trainers["on_policy"].accumulate_gradients(batch),  # same sequences, ratio loss
        "fwd_bwd_floor": lambda: floor_pass(trainers["ftis"], batch),
    }
    trl = trl_arm(node, batch)
    notes = []
    if isinstance(trl, str):
        notes.append(trl)
    else:
        arms["trl_grpo"] = trl
    times: dict[str, list[float]] = {k: [] for k in arms}
    for fn in arms.values():  # warm-up
        fn()
    for _ in range(args.repeats):
        for name, fn in arms.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seed": seed, "sequences": len(batch.sequences),
            "tokens": sum(len(s.ids) for s in batch.sequences), "median_s": med,
            "ratio_to_ftis": {k: v / med["ftis"] for k, v in med.items()}, "notes": notes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(ap, seeds=3, quick_seeds=1, quick="5 repeats")
    ap.add_argument("--model", default="tiny-s")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    if args.quick:
        args.repeats = 5
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure(args.model, s, args, Path(tmp)) for s in seeds]
    arms = list(runs[0]["median_s"])
    print(f"\n{args.model}: {runs[0]['sequences']} sequences ({args.prompts} prompts x {args.g}, half from a second "
          f"batch as 'external'), {args.repeats} repeats per arm, median; mean +- std over {len(runs)} seed(s)\n")
    print(f"{'arm':14s} {'ms per gradient pass':>22s} {'x F-TIS':>16s}")
    for a in arms:
        ms = mean_std([1000 * r["median_s"][a] for r in runs])
        ratio = mean_std([r["ratio_to_ftis"][a] for r in runs])
        print(f"{a:14s} {fmt_ms(ms, '.1f'):>22s} {fmt_ms(ratio, '.2f'):>16s}")
    for note in sorted({n for r in runs for n in r["notes"]}):
        print(f"note: {note}")
    write_json(args.json, {"args": public_args(args), "runs": runs}, args)


if __name__ == "__main__":
    main()
