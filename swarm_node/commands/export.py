"""`swarm-node export`: take the trained model out of a node's state dir as a Hugging Face directory.

The newest readable checkpoint's weights are put back into the base model and saved with
`save_pretrained` (plus the tokenizer), so `AutoModelForCausalLM.from_pretrained(DIR)` loads it on any
machine. A LoRA node exports a peft adapter directory (adapter_config.json + adapter weights, pointing at
its base model), or with --merge-lora one plain model with the adapter folded in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "export"
HELP = "write the newest checkpoint of a state dir as a Hugging Face model (or peft adapter) directory"

EXPORT_META_FILE = "swarm_node_export.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("state_dir", type=Path, metavar="STATE_DIR", help="the node's --state-dir")
    p.add_argument("--out", type=Path, required=True, help="output directory (created; must be empty or absent)")
    p.add_argument("--merge-lora", action="store_true",
                   help="LoRA nodes: fold the adapter into the base weights and write one plain model")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from swarm_node.errors import UserFacingError
    from swarm_node.node.checkpoint import is_state_dir, latest_checkpoint, load_trained_model

    state_dir: Path = args.state_dir.expanduser()
    out: Path = args.out.expanduser()
    if not is_state_dir(state_dir):
        raise UserFacingError(f"{state_dir} is not a node state dir (no ckpt-* directories)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserFacingError(f"--out {str(out)!r} exists and is not an empty directory; pick another path")
    newest = latest_checkpoint(state_dir)
    if args.merge_lora and newest is not None and newest.meta.get("is_lora") is False:
        raise UserFacingError(f"{state_dir} trains a full model, not a LoRA adapter: drop --merge-lora")
    loaded, ck = load_trained_model(state_dir, dtype="float32", device="cpu")
    model = loaded.model
    kind = "model"
    if loaded.is_lora:
        if args.merge_lora:
            model = model.merge_and_unload()
            kind = "merged"
        else:
            kind = "adapter"
    elif args.merge_lora:
        raise UserFacingError(f"{state_dir} trains a full model, not a LoRA adapter: drop --merge-lora")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)  # safetensors; a PeftModel writes adapter_config.json + adapter weights
    loaded.tokenizer.save_pretrained(out)
    if kind != "adapter":
        _copy_preset_meta(loaded.meta, out)
    record = {"kind": kind, "state_dir": str(state_dir.resolve()), "round": ck.round, "checkpoint": ck.path.name,
              "base_model": ck.meta.get("model_path"), "out": str(out)}
    (out / EXPORT_META_FILE).write_text(json.dumps(record, indent=1))
    if args.json:
        print(json.dumps(record))
    else:
        what = {"model": "model", "merged": "model (LoRA merged)", "adapter": "peft adapter"}[kind]
        print(f"exported {what} of round {ck.round} from {state_dir} -> {out}")
    return 0


def _copy_preset_meta(meta: dict, out: Path) -> None:
    """Keep the preset's defaults (learning rates) for a model trained from a preset; its hash no longer holds."""
    from swarm_node.models.presets import PRESET_META_FILE

    if meta.get("preset"):
        kept = {k: v for k, v in meta.items() if k != "sha256"}
        (out / PRESET_META_FILE).write_text(json.dumps(kept, indent=2))
