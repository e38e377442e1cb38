"""Which model fits which card: `swarm-node plan` over real models' shapes, full and LoRA, at 16-80 GB.

Each row is peers/qwen2.5-0.5b-instruct.yaml's round (8 prompts x 8 completions of up to 512 tokens after
prompts of up to 256, vLLM sleeping during the step, gradient checkpointing, micro-batches of 8192 tokens)
on the config of a public checkpoint (models/standins.py: only its config.json is written; no weight is
made), full or with a LoRA adapter (r 16 on every linear layer). The cells are the predicted device peak in
GiB, and whether it fits. Predicted, not measured: benchmarks/gpu_smoke.py checks the plan against a GPU.

    python -m benchmarks.plan_table
    python -m benchmarks.plan_table --quick   # two models
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tooling.benchmark_args import add_run_args, public_args, resolve_seeds, write_json

ROOT = Path(__file__).resolve().parents[1]
CARDS = (16, 24, 40, 80)
MODELS = ("qwen2.5-0.5b-instruct", "qwen3-0.6b", "smollm2-360m-instruct", "llama-3.2-1b-instruct",
          "qwen2.5-1.5b-instruct", "qwen2.5-3b-instruct", "qwen2.5-7b-instruct")


def main(argv: list[str] | None = None) -> int:
    from swarm_node.config import load_config
    from swarm_node.models.standins import STANDINS, standin_config
    from swarm_node.planning import GIB, plan_node

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(ap, seeds=1, quick="two models", seeds_help="unused (the plan is deterministic)")
    args = ap.parse_args(argv)
    resolve_seeds(args)
    models = MODELS[:2] if args.quick else MODELS
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            d = Path(tmp) / name
            standin_config(name).save_pretrained(d)
            for lora in (False, True):
                sets = [f"model.path={d}", f"model.lora.enabled={str(lora).lower()}", "model.lora.r=16",
                        "model.lora.alpha=32"]
                cfg = load_config(ROOT / "peers" / "qwen2.5-0.5b-instruct.yaml", sets)
                cells = {}
                for card in CARDS:
                    plan, advice = plan_node(cfg, device="cuda", device_bytes=card * GIB)
                    cells[card] = {"peak_gib": round(plan.peak / GIB, 1), "fits": bool(plan.fits),
                                   "fix": advice[0].change if advice else None}
                rows.append({"model": STANDINS[name].source, "training": "LoRA r16" if lora else "full",
                             "parameters": plan.shape.params, "trained": plan.shape.trained_params, "cards": cells})
    print(f"| model | training | {' | '.join(f'{c} GB' for c in CARDS)} |")
    print(f"|---|---|{'---|' * len(CARDS)}")
    for r in rows:
        cells = []
        for card in CARDS:
            c = r["cards"][card]
            cells.append(f"{c['peak_gib']} fits" if c["fits"] else f"{c['peak_gib']} no" +
                         (f" ({c['fix']})" if c["fix"] and card >= 24 else ""))
        print(f"| {r['model']} | {r['training']} | {' | '.join(cells)} |")
    write_json(args.json, {"args": public_args(args), "cards_gb": list(CARDS), "rows": rows}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
