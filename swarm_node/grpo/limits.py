"""How much of a peer's batch this node accepts before decoding it, derived from its own configuration.

Every bound follows from what the node itself sends per round (prompts, G, completion and prompt length),
with 4x room: a peer on other settings or another model may send longer completions or more groups, but
a batch whose decode or training forward would dwarf our own round is refused before it costs anything.
Prompts are bounded by `generation.max_prompt_tokens`, the length this node cuts its own prompts to: a
peer's group is admitted only if its prompt ids equal ours, so a longer prompt could never be used.
"""

from __future__ import annotations

import dataclasses

from swarm_node.config import NodeConfig
from swarm_node.protocol import DecodeLimits, max_payload_bytes

ROOM = 4  # a peer's batch may be this many times our own round in each dimension


def receive_limits(cfg: NodeConfig) -> DecodeLimits:
    """The DecodeLimits of a GRPO node with config `cfg`. The compressed size follows from the rest: the
    largest payload a batch within them can be (`max_payload_bytes`: ~0.5 MiB by default, not
    swarm.max_batch_bytes' 64 MiB; DPO's parameter payloads have their own, dpo.max_payload_bytes), so a junk offer
    cannot make the node download and hold more than a valid batch could need."""
    g = cfg.generation
    groups = ROOM * cfg.task.prompts_per_round
    per_completion = ROOM * g.max_new_tokens
    completions = groups * g.num_generations
    limits = DecodeLimits(
        max_compressed_bytes=cfg.swarm.max_batch_bytes,
        max_groups=groups,
        max_completions_per_group=ROOM * g.num_generations,
        max_completions=completions,
        max_prompt_tokens=g.max_prompt_tokens,
        max_tokens_per_completion=per_completion,
        max_total_tokens=completions * per_completion + groups * g.max_prompt_tokens,
    )
    return dataclasses.replace(limits, max_compressed_bytes=max_payload_bytes(limits))
