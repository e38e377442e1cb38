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
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
