"""A training step's peak memory and time on a Qwen2.5-0.5B-shaped model on CPU, before and after the learner's
memory work, side by side in one run.

Arms, each in a fresh process on the same random-init model (Qwen2.5-0.5B's config: 24 layers, 896 wide,
151,936-token vocabulary, 494M parameters) and the same round of random tokens:
- before: the trainer at --before-ref (default b6b7be6, the last commit before it), taken from git into a
  temporary directory: the model's logits at every completion position, an fp32 copy, divided by T,
  log-softmax; micro-batches of micro_batch_size 32 sequences;
- after: this checkout, defaults (micro_batch_tokens 8192, the output head a chunk at a time);
- after + checkpointing: training.gradient_checkpointing on;
- after, bf16 compute: model.dtype bfloat16 (fp32 master weights, autocast), to show what autocast costs on a
  CPU (a GPU is where it pays).
Each arm runs one warm-up step (Adam's state appears there) and one measured step; the peak is the measured
step's resident-set high-water mark (VmHWM) less the resident set before the model was built, with glibc's
mmap threshold fixed so freed tensors leave the resident set. Arms run one after another, --seeds times
(another round of random tokens per seed), and the table prints the mean and the ratio to `before`.

    python -m benchmarks.learner_memory            # P 2 x G 8 x (32 prompt + 128 completion) tokens, 2 seeds
    python -m benchmarks.learner_memory --quick    # 4 layers, 64-token completions, 1 seed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from io import BytesIO
from pathlib import Path

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
    import json, re, sys, time
    from pathlib import Path
    import numpy as np, torch
    torch.set_num_threads(int(sys.argv[1]))
    spec = json.loads(sys.argv[2])

    def status(field):
        return int(re.search(rf"^{field}:\\s+(\\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) * 1024

    base = status("VmRSS")
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from swarm_node.config import TrainingConfig
    from swarm_node.training.groups import TrainGroup
    try:
        from swarm_node.training.ftis_step import FTISTrainer
    except ImportError:  # the `before` arm's source predates the name
        from swarm_node.training.grpo_step import GRPOTrainer as FTISTrainer
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=spec["layers"],
                      num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.train()
    kwargs = {}
    if spec["arm"] != "before":
        from swarm_node.models.loading import decoder_layers
        from swarm_node.models.precision import autocast_forwards
        compute = {"float32": torch.float32, "bfloat16": torch.bfloat16}[spec["dtype"]]
        autocast_forwards(model, compute)
        kwargs = {"compute_dtype": compute,
                  "checkpoint_layers": decoder_layers(model) if spec["training"].get("gradient_checkpointing") else ()}
    trainer = FTISTrainer(model, TrainingConfig(lr=1e-6, **spec["training"]), 0, temperature=0.7, **kwargs)
    rng = np.random.default_rng(spec["seed"])
    g, c, p = spec["generations"], spec["completion"], spec["prompt"]
    groups = [TrainGroup(prompt_ids=rng.integers(1, 30000, p).tolist(),
                         completions=[rng.integers(1, 30000, c) for _ in range(g)],
                         behaviour_logprobs=[np.full(c, -3.0, np.float32) for _ in range(g)],
                         rewards=np.tile(np.array([1.0, 0.0], np.float32), g // 2)) for _ in range(spec["prompts"])]
    trainer.step(groups)
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    res = trainer.step(groups)
    secs = time.perf_counter() - t0
    print(json.dumps({"peak_bytes": status("VmHWM") - base, "seconds": secs, "stepped": res.stepped,
                      "loss": res.loss}))
"""

ARMS = {
    "before": {"source": "before", "dtype": "float32", "training": {"micro_batch_size": 32}},
    "after": {"source": "after", "dtype": "float32", "training": {}},
    "after + checkpointing": {"source": "after", "dtype": "float32", "training": {"gradient_checkpointing": True}},
    "after, bf16 compute": {"source": "after", "dtype": "bfloat16", "training": {}},
}


def export_ref(ref: str, out: Path) -> Path:
    """The swarm_node package as it was at `ref`, written under `out` (nothing in the checkout changes)."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "swarm_node"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(out, filter="data")
    return out


def run_arm(name: str, source: Path, spec: dict, threads: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(source)}
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(threads), json.dumps(spec)],
                         capture_output=True, text=True, env=env, cwd=source, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"arm {name!r} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, seeds=2, quick="4 layers, 64-token completions, 1 seed", quick_seeds=1)
    ap.add_argument("--before-ref", default="b6b7be6", help="the git commit of the `before` arm")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per arm (arms run one at a time)")
    args = ap.parse_args(argv)
    seeds = resolve_seeds(args)
    shape = {"layers": 4 if args.quick else 24, "prompts": 2, "generations": 8, "prompt": 32,
             "completion": 64 if args.quick else 128}
    results: dict[str, list[dict]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"before": export_ref(args.before_ref, Path(tmp) / "before"), "after": ROOT}
        for seed in seeds:
            for name, arm in ARMS.items():
                spec = {**shape, "seed": seed, "arm": arm["source"], "dtype": arm["dtype"], "training": arm["training"]}
                r = run_arm(name, sources[arm["source"]], spec, args.threads)
                results[name].append(r)
                print(f"seed {seed} {name:<24} peak {r['peak_bytes'] / 2**30:6.2f} GiB  step {r['seconds']:7.1f} s",
                      flush=True)
    tokens = shape["prompts"] * shape["generations"] * (shape["prompt"] + shape["completion"])
    print(f"\nQwen2.5-0.5B-shaped ({shape['layers']} layers, vocabulary 151,936), one step on {tokens} tokens "
          f"({shape['prompts']} x {shape['generations']} x ({shape['prompt']} + {shape['completion']})), "
          f"{len(seeds)} seed(s), {args.threads} threads")
    before_peak = sum(r["peak_bytes"] for r in results["before"]) / len(seeds)
    before_s = sum(r["seconds"] for r in results["before"]) / len(seeds)
    table = {}
    print(f"{'arm':<24} {'peak GiB':>9} {'x before':>9} {'step s':>8} {'x before':>9}")
    for name, rows in results.items():
        peak = sum(r["peak_bytes"] for r in rows) / len(rows)
        secs = sum(r["seconds"] for r in rows) / len(rows)
        table[name] = {"peak_gib": peak / 2**30, "peak_ratio": peak / before_peak, "step_s": secs,
                       "step_ratio": secs / before_s}
        print(f"{name:<24} {peak / 2**30:9.2f} {peak / before_peak:9.2f} {secs:8.1f} {secs / before_s:9.2f}")
    write_json(args.json, {"args": public_args(args), "shape": shape, "arms": table, "runs": results}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
