"""Render docs/configuration.md from the pydantic config models, so the docs cannot drift from the code.

`python -m swarm_node.config_docs > docs/configuration.md` regenerates it; a test fails when they differ.
"""

from __future__ import annotations

import json
import typing

from pydantic import BaseModel

from swarm_node.config import NodeConfig

HEADER = """# Configuration

A node is configured by one YAML file (`swarm-node run --config FILE`) whose top-level keys are the
sections below; any key can be overridden on the command line with `--set section.key=value` (the value
is parsed as YAML, e.g. `--set swarm.initial_peers='["/ip4/1.2.3.4/tcp/31337/p2p/Qm..."]'`).
`--initial-peers M ...` is a shortcut that also sets `swarm.enabled=true`.

Any key can also be set by an environment variable `SWARM_NODE__SECTION__KEY` (double underscores
between the parts, case-insensitive, value parsed as YAML), e.g. `SWARM_NODE__TRAINING__LR=1e-4` or
`SWARM_NODE__ROUNDS=100`; handy in containers. Precedence, lowest first: built-in defaults < the YAML
file < environment variables < `--set` (and the flags that are shortcuts for it). TRL users can keep
TRL's names for the keys that mean the same thing (see "Coming from TRL" at the end).

Unknown keys and bad values fail at start with a message that names the key, the value and what is
allowed. This file is generated from `swarm_node/config.py` by `python -m swarm_node.config_docs`; a
test checks that it matches the code.

Example (`peers/tiny-s.yaml`):

```yaml
model: {path: tiny-s}
task: {name: arithmetic, prompts_per_round: 8}
generation: {num_generations: 8, max_new_tokens: 6}
training: {variant: ftis}
swarm: {enabled: true, swarm_id: demo}
```
"""


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        (arg,) = typing.get_args(annotation) or (typing.Any,)
        return f"list[{_type_name(arg)}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _constraints(field) -> str:
    out = []
    for m in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("pattern", "matches")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} `{v}`".replace("|", "\\|"))
    return ", ".join(out)


def _section(name: str, model: type[BaseModel], lines: list[str]) -> None:
    lines.append(f"\n## `{name}`\n")
    doc = (model.__doc__ or "").strip().splitlines()
    if doc:
        lines.append(doc[0] + "\n")
    lines.append("| key | type | default | allowed | meaning |")
    lines.append("|---|---|---|---|---|")
    nested = []
    for key, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            nested.append((f"{name}.{key}", ann))
            lines.append(f"| `{key}` | section | see `{name}.{key}` | | |")
            continue
        default = field.default
        shown = json.dumps(default.model_dump() if isinstance(default, BaseModel) else default)
        lines.append(f"| `{key}` | {_type_name(ann)} | `{shown}` | {_constraints(field)} | {field.description or ''} |")
    for sub_name, sub in nested:
        _section(sub_name, sub, lines)


# (TRL key, swarm-node key or "-", note); a key that is also in config.TRL_ALIASES is marked as accepted.
TRL_GRPO = [
    ("learning_rate", "training.lr", "DPO mode: `dpo.lr`"),
    ("lr_scheduler_type", "training.lr_schedule", "`constant`, `linear`, `cosine`; TRL's `constant_with_warmup` "
     "is `constant` with `training.warmup_rounds`"),
    ("warmup_steps", "training.warmup_rounds", "counted in rounds (one update of `steps_per_round` steps each)"),
    ("warmup_ratio", "training.warmup_rounds", "= ratio x `rounds`"),
    ("max_grad_norm", "training.grad_clip", "also used by DPO mode"),
    ("weight_decay", "training.weight_decay", "same name"),
    ("optim", "training.optimizer", "`adam`, `adamw` (TRL's `adamw_torch`), `sgd`"),
    ("epsilon", "training.clip_eps", "PPO clip; active only when `steps_per_round > 1`"),
    ("epsilon_high", "-", "the clip is symmetric"),
    ("num_iterations", "training.steps_per_round", "optimizer steps on one round's batch"),
    ("vllm_importance_sampling_cap", "training.cap", "truncation C of the per-token importance ratio "
     "(here between a peer's sampling policy and ours)"),
    ("beta", "-", "no KL term and no reference model in GRPO mode (TRL's default is 0.0 too)"),
    ("num_generations", "generation.num_generations", "same name"),
    ("max_completion_length", "generation.max_new_tokens", ""),
    ("temperature", "generation.temperature", "same name"),
    ("use_vllm", "generation.backend", "`vllm`"),
    ("max_prompt_length", "-", "prompts are not truncated"),
    ("per_device_train_batch_size", "task.prompts_per_round", "x `generation.num_generations` completions per "
     "round; `training.micro_batch_tokens` bounds memory, `generation.batch_size` the decode chunk"),
    ("gradient_accumulation_steps", "-", "a round's groups (own and peers') are one batch"),
    ("scale_rewards", "-", "always per group, as TRL's `\"group\"`: `(r - mean) / (std + training.adv_eps)`"),
    ("loss_type", "-", "one token-level loss; `training.variant` picks the off-policy correction "
     "(docs/algorithms.md)"),
    ("max_steps", "rounds", "one round = sample, exchange, one update"),
    ("seed", "seed", "same name; give each node its own"),
    ("bf16", "model.dtype", "`bfloat16` (`auto` picks it on a GPU that supports it): bf16 compute with fp32 "
     "master weights, as TRL's autocast"),
    ("gradient_checkpointing", "training.gradient_checkpointing", "same name; here it works in eval mode and "
     "keeps the shared-prompt forward"),
    ("report_to", "metrics.report_to", "same name: `tensorboard`, `wandb`, `all`, `none`"),
    ("logging_steps", "-", "every round is a metrics.jsonl row"),
    ("eval_steps", "metrics.eval_every", "in rounds"),
    ("save_steps", "checkpoint.every_rounds", "in rounds"),
    ("save_total_limit", "checkpoint.keep", ""),
    ("output_dir", "-", "`swarm-node run --state-dir`"),
]
TRL_DPO = [
    ("beta", "dpo.beta", "same name"),
    ("learning_rate", "dpo.lr", ""),
    ("per_device_train_batch_size", "dpo.batch_size", "preference pairs per local step"),
    ("max_length", "dpo.max_length", "same name"),
    ("max_prompt_length", "-", "the prompt is cut on the left to fit `dpo.max_length`"),
    ("loss_type", "-", "the sigmoid DPO loss only"),
    ("max_grad_norm", "training.grad_clip", ""),
    ("lr_scheduler_type", "training.lr_schedule", "the same schedule, over DPO rounds"),
    ("max_steps", "rounds", "x `dpo.local_steps` optimizer steps"),
]

TRL_HEADER = """
## Coming from TRL

Keys of TRL's `GRPOConfig` and `DPOConfig` and where they live here. Those marked *accepted* may be written
with TRL's name inside the section they belong to (`training: {learning_rate: 1e-6}` is
`training: {lr: 1e-6}`; `--set training.learning_rate=1e-6` and `SWARM_NODE__TRAINING__LEARNING_RATE`
work too); giving both names is an error. The others differ in meaning or unit, so they have only our name.
"""


def _trl_table(title: str, rows: list[tuple[str, str, str]], lines: list[str]) -> None:
    from swarm_node.config import TRL_ALIASES

    lines.append(f"\n### {title}\n")
    lines.append("| TRL key | swarm-node key | TRL name accepted | note |")
    lines.append("|---|---|---|---|")
    for trl, ours, note in rows:
        section, _, key = ours.partition(".")
        accepted = TRL_ALIASES.get(section, {}).get(trl) == key if key else False
        shown = f"`{ours}`" if ours != "-" else "-"
        lines.append(f"| `{trl}` | {shown} | {'yes' if accepted or trl == key or trl == ours else ''} | {note} |")


def render() -> str:
    lines = [HEADER]
    top = []
    for key, field in NodeConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            top.append((key, ann))
    lines.append("## top level\n")
    lines.append("| key | type | default | allowed | meaning |")
    lines.append("|---|---|---|---|---|")
    for key, field in NodeConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            continue
        lines.append(f"| `{key}` | {_type_name(ann)} | `{json.dumps(field.default)}` | {_constraints(field)} | "
                     f"{field.description or ''} |")
    for key, model in top:
        _section(key, model, lines)
    lines.append(TRL_HEADER)
    _trl_table("GRPOConfig", TRL_GRPO, lines)
    _trl_table("DPOConfig", TRL_DPO, lines)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
