"""Preset builds: the same bytes with and without a busy core, and how long each takes.

Builds a preset (in a fresh subprocess per build, so nothing is shared) once on an idle machine and once
while a busy-loop process spins on core 0, and prints the build time ratio and whether the weights'
sha256 are equal. `--threads 1,2` also builds with 2 torch threads (the old recipe) to show what OpenMP
threads spinning against a busy core cost.

    python -m benchmarks.preset_build --preset tiny-s --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tooling.benchmark_args import add_run_args, resolve_seeds, write_json

BUILD = """
import json, sys, time, torch
import swarm_node.models.factory as f
from swarm_node.models import presets
presets_threads = int(sys.argv[3])
f.BUILD_THREADS = presets_threads
t = time.perf_counter()
meta = f.build_tiny(sys.argv[1], sys.argv[2], seed=int(sys.argv[4]), max_steps=int(sys.argv[5]) or None)
print(json.dumps({"seconds": time.perf_counter() - t, "sha256": meta["sha256"], "id": meta["eval_id_accuracy"]}))
"""

SPIN = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


def build(preset: str, threads: int, seed: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", BUILD, preset, str(Path(tmp) / "m"), str(threads), str(seed),
                              str(steps)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-s")
    add_run_args(ap, seeds=1, quick="100 warm-up steps instead of the full schedule",
                 seeds_help="builds per arm (the warm-up seed of each)")
    ap.add_argument("--steps", type=int, default=0, help="stop the warm-up after this many steps (0: the full schedule)")
    ap.add_argument("--threads", default="1", help="comma-separated torch thread counts to compare")
    args = ap.parse_args()
    seeds = resolve_seeds(args)
    steps = 100 if args.quick else args.steps
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for seed in seeds:
            load_idle = os.getloadavg()[0]
            idle = build(args.preset, threads, seed, steps)
            spin = subprocess.Popen([sys.executable, "-c", SPIN])
            try:
                time.sleep(0.5)
                load_busy = os.getloadavg()[0]
                busy = build(args.preset, threads, seed, steps)
            finally:
                spin.kill()
                spin.wait()
            rows.append({"threads": threads, "seed": seed, "idle_s": idle["seconds"], "busy_s": busy["seconds"],
                         "busy_over_idle": busy["seconds"] / idle["seconds"],
                         "same_sha256": idle["sha256"] == busy["sha256"], "sha256": idle["sha256"][:16],
                         "sha256_busy": busy["sha256"][:16], "load_before_idle": load_idle, "load_before_busy": load_busy})
            r = rows[-1]
            print(f"{args.preset} threads={threads} seed={seed}: idle {r['idle_s']:.1f} s, one core busy "
                  f"{r['busy_s']:.1f} s (x{r['busy_over_idle']:.2f}), sha256 equal: {r['same_sha256']} "
                  f"({r['sha256']} / {r['sha256_busy']}; load average before each build {load_idle:.1f} / {load_busy:.1f})",
                  flush=True)
    print(f"cores: {os.cpu_count()}, load average at the end: {os.getloadavg()[0]:.1f} "
          "(a loaded machine makes every time noisy; compare ratios within one run)")
    write_json(args.json, {"rows": rows}, args)


if __name__ == "__main__":
    main()
