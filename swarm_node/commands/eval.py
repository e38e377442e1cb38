"""`swarm-node eval`: greedy accuracy of a saved model, a node's state dir, or a preset on a held-out split.

A state dir is evaluated on the weights of its newest readable checkpoint, exactly as `swarm-node export`
would write them, so evaluating the exported directory gives the same number.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "eval"
HELP = "greedy exact-match accuracy of a model on a task's held-out eval split"

DEFAULT_MAX_NEW_TOKENS = {"arithmetic": 8, "gsm8k": 64, "reasoning_gym": 16, "files": 32}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="saved model directory, a node's --state-dir, hub id, or preset name (tiny-s, tiny-m)")
    p.add_argument("--task", default="arithmetic", choices=sorted(DEFAULT_MAX_NEW_TOKENS))
    p.add_argument("--split", default="id", choices=["id", "ood", "ood_formats", "ood3", "union"],
                   help="eval split: arithmetic has id (add and sub), ood ('+12-7=': the leading-sign format), "
                        "union (add, sub and signed in turns), ood_formats (spaced and chained), ood3 (3-digit "
                        "operands); others only id. Tasks with parts also report each part")
    p.add_argument("--n", type=int, default=200, help="number of eval prompts (the first n of the split)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 8 for arithmetic, 64 for gsm8k")
    p.add_argument("--data-path", default=None, help="gsm8k: JSONL or parquet file")
    p.add_argument("--eval-data-path", default=None, help="gsm8k: held-out file (default: the last 10%% of --data-path)")
    p.add_argument("--datasets", default=None, help="reasoning_gym: comma-separated dataset names (default configs)")
    p.add_argument("--prompt-field", default="prompt", help="files: the prompt field")
    p.add_argument("--answer-field", default="answer", help="files: the answer field")
    p.add_argument("--part-field", default=None, help="files: the field naming each record's part (accuracy per part)")
    p.add_argument("--reward", default=None, help="files: reward function 'module:function' (default: exact match)")
    p.add_argument("--chat-template", default=None,
                   help="auto (the tokenizer's template if it has one), on, off, or a Jinja file; default: what a "
                        "state dir's node used, else auto (the node's default)")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longer prompts keep their last N tokens; default: a state dir's setting, else 1024")
    p.add_argument("--prompt-form", default=None, choices=["bare", "fewshot", "chat"],
                   help="arithmetic, reasoning_gym: how problems are posed (docs/tasks.md); default: what a state "
                        "dir's node used, else bare")
    p.add_argument("--max-operand", type=int, default=None,
                   help="arithmetic: operands 0..N of the id split; default: a state dir's setting, else 99")
    p.add_argument("--batch-size", type=int, default=256, help="sequences decoded together")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from swarm_node.config import GenerationConfig, TaskConfig
    from swarm_node.errors import UserFacingError
    from swarm_node.evaluation import evaluate
    from swarm_node.generation.prompts import PromptEncoder, chat_template_setting
    from swarm_node.models.loading import load_model
    from swarm_node.node.checkpoint import is_state_dir, load_trained_model
    from swarm_node.tasks import get_task

    if args.n < 1:
        raise UserFacingError(f"--n must be at least 1, got {args.n}")
    if args.batch_size < 1:
        raise UserFacingError(f"--batch-size must be at least 1, got {args.batch_size}")
    max_new = args.max_new_tokens if args.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS[args.task]
    if max_new < 1:
        raise UserFacingError(f"--max-new-tokens must be at least 1, got {max_new}")
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()] if args.datasets else None
    recorded: dict = {}
    if is_state_dir(Path(args.model).expanduser()):
        loaded, ck = load_trained_model(Path(args.model).expanduser(), dtype=args.dtype, device=args.device)
        recorded = ck.meta.get("prompt_encoding") or {}
    else:
        loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    form = args.prompt_form or recorded.get("prompt_form") or "bare"
    try:
        task_cfg = TaskConfig(name=args.task, data_path=args.data_path, eval_data_path=args.eval_data_path,
                              eval_split=args.split, datasets=datasets, prompt_field=args.prompt_field,
                              answer_field=args.answer_field, reward=args.reward, part_field=args.part_field,
                              prompt_form=form,
                              max_operand=args.max_operand or recorded.get("max_operand") or 99)
    except ValueError as exc:  # pydantic: --max-operand out of range
        raise UserFacingError(f"--max-operand: {exc.errors()[0]['msg']}") from None
    task = get_task(task_cfg)
    node_default = GenerationConfig()  # what a node uses when its config says nothing (and older checkpoints)
    template = chat_template_setting(args.chat_template or recorded.get("chat_template") or node_default.chat_template,
                                     form)
    max_prompt = args.max_prompt_tokens if args.max_prompt_tokens is not None else int(
        recorded.get("max_prompt_tokens") or node_default.max_prompt_tokens)
    if max_prompt < 1:
        raise UserFacingError(f"--max-prompt-tokens must be at least 1, got {max_prompt}")
    encoder = PromptEncoder(loaded.tokenizer, template, max_prompt)  # the node's one way to encode prompts
    result = evaluate(loaded.model, loaded.tokenizer, task, args.split, args.n, max_new, batch_size=args.batch_size,
                      encode=encoder.encode)
    result = {"task": args.task, "model": args.model, **result, "max_new_tokens": max_new,
              "chat_template": "on" if encoder.template else "off", "max_prompt_tokens": encoder.max_prompt_tokens,
              "prompt_form": form}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.model} on {args.task}/{result['split']}: accuracy {result['accuracy']:.3f} "
              f"({round(result['accuracy'] * result['n'])}/{result['n']}), mean reward {result['reward_mean']:.3f}, "
              f"{result['seconds']:.1f} s")
        for name, d in result.get("by_part", {}).items():
            print(f"  {name}: accuracy {d['accuracy']:.3f} (n={d['n']})")
    return 0
