"""The metrics row of a round, typed: one class per mode, each built in one place.

A row is one line of metrics.jsonl (and the values Prometheus and the trackers see). Its JSON keys are
the field names, in field order; the keys that older swarm-node versions wrote are unchanged, so
`swarm-node report` reads old runs and new ones alike (docs/operations.md, "metrics.jsonl"). Fields
marked `optional` are left out of the JSON while they are None (the model record of the first row, the
eval size of rounds that evaluated); a `SwarmCosts` field is written flat, and only when the node
exchanges over a swarm. NaN stays NaN in the row and is written as null (node/metrics.py).

Rows are read-only mappings too (`row["reward_mean"]`, `row.get(...)`), so code that handled the dict rows
of earlier versions keeps working.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

_now = time.time  # (a row's `time` field shadows the module inside the class body)
OPTIONAL = {"optional": True}  # field metadata: left out of the JSON while None
FLAT = {"flat": True}  # field metadata: a nested record written as top-level keys (when not None)


@dataclass(kw_only=True)
class RoundRow(Mapping):
    """Fields every mode's row has. `round` is the round's number (docs/architecture.md, "Round numbers")."""

    round: int
    rejected: dict[str, int] = field(default_factory=dict)  # peers' data declined, by reason (node/reasons.py)
    checkpoint_failures: int = 0  # saves that failed so far (disk full...)
    model: dict | None = field(default=None, metadata=OPTIONAL)  # the first row: which model the run started from

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("flat"):
                if value is not None:
                    out.update(value.to_json())
            elif value is not None or not f.metadata.get("optional"):
                out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(kw_only=True)
class SwarmCosts:
    """What a GRPO round's exchange cost and brought (docs/architecture.md, "The exchange")."""

    payload_bytes_out: int = 0
    control_bytes_in: int = 0
    control_bytes_out: int = 0
    batch_age_s_mean: float | None = None  # of the peers' batches trained on
    batch_age_s_max: float | None = None
    version_lag_mean: float | None = None
    version_lag_max: int | None = None
    buffer_evicted: int = 0
    buffer_superseded: int = 0
    declined: int = 0  # announcements of another task universe, tokenizer or mode (never downloaded)

    @classmethod
    def of(cls, ages: list[float], lags: list[int], events: dict, payload_bytes_out: int, control_bytes_in: int,
           control_bytes_out: int) -> SwarmCosts:
        return cls(payload_bytes_out=payload_bytes_out, control_bytes_in=control_bytes_in,
                   control_bytes_out=control_bytes_out,
                   batch_age_s_mean=round(float(np.mean(ages)), 3) if ages else None,
                   batch_age_s_max=round(float(max(ages)), 3) if ages else None,
                   version_lag_mean=round(float(np.mean(lags)), 3) if lags else None,
                   version_lag_max=int(max(lags)) if lags else None,
                   buffer_evicted=events.get("evicted", 0), buffer_superseded=events.get("superseded", 0),
                   declined=events.get("declined", 0))

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(kw_only=True)
class GRPORow(RoundRow):
    """One GRPO round: its own samples, the F-TIS step, the exchange, times, and (some rounds) the eval.

    Round 0 is the evaluation of the model as loaded (`initial`): nothing trained, the counts are 0.
    """

    reward_mean: float | None = None  # mean reward of this round's own samples
    loss: float | None = None  # None when the step did not run (nothing to train on)
    local_groups: int = 0
    external_groups: int = 0
    filtered: int = 0  # sequences the F-TIS filter dropped
    filtered_external: int = 0
    kept: int = 0
    zero_advantage_groups: int = 0
    mean_ratio_local: float | None = None  # != 1 when pipelined: own samples one version old
    mean_ratio_external: float | None = None
    truncated_frac_external: float | None = None
    divergence_external: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    stepped: bool = False
    tokens_per_s: float | None = None
    gen_s: float = 0.0
    gen_wait_s: float | None = None  # round time spent waiting for its own samples (pipelined: < gen_s)
    policy_version: int | None = None  # the policy that sampled this round's own groups
    local_version_lag: int | None = None  # 1 when pipelined, else 0
    train_s: float = 0.0
    collect_s: float | None = None  # time spent in the swarm's receive
    external_groups_by_peer: dict[str, int] = field(default_factory=dict)
    rewards_overridden: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    time: float = field(default_factory=_now)  # unix time the round ended (before its eval)
    task_id: str | None = field(default=None, metadata=OPTIONAL)  # round 0
    bytes_per_token: float | None = field(default=None, metadata=OPTIONAL)  # of the batch we published
    swarm: SwarmCosts | None = field(default=None, metadata=FLAT)
    eval_accuracy: float | None = None  # of the whole eval set (with parts: their union)
    eval_n: int | None = field(default=None, metadata=OPTIONAL)
    eval_hits: list[int] | None = field(default=None, metadata=OPTIONAL)  # per problem, for paired statistics
    eval_acc_parts: dict[str, float] | None = field(default=None, metadata=OPTIONAL)  # tasks with parts
    eval_n_parts: dict[str, int] | None = field(default=None, metadata=OPTIONAL)
    task_mix: dict[str, float] | None = field(default=None, metadata=OPTIONAL)  # round 0: this node's local mix
    time_split_s: dict[str, float] | None = field(default=None, metadata=OPTIONAL)  # node/timing.py phases
    oom_retries: int | None = field(default=None, metadata=OPTIONAL)  # out-of-memory retries of the step (if any)
    micro_batch_tokens: int | None = field(default=None, metadata=OPTIONAL)  # the token budget, once OOM halved it
    engine_s: dict[str, float] | None = field(default=None, metadata=OPTIONAL)  # vLLM: sleep, wake, sync seconds

    @classmethod
    def initial(cls, eval_keys: dict, model: dict, task_id: str, task_mix: dict | None = None) -> GRPORow:
        """Round 0: the held-out accuracy of the model as loaded (`eval_keys`: evaluation.eval_metrics)."""
        return cls(round=0, model=model, task_id=task_id, task_mix=task_mix).with_eval(eval_keys)

    def with_eval(self, eval_keys: dict) -> GRPORow:
        """This row with an evaluation's keys (evaluation.eval_metrics: accuracy, n, hits, per part)."""
        for key, value in eval_keys.items():
            setattr(self, key, value)
        return self


@dataclass(kw_only=True)
class DPORow(RoundRow):
    """One DPO round: the local steps, the average with the neighbours, and (some rounds) the held-out eval."""

    dpo_loss: float
    lr: float
    train_pref_acc: float
    heldout_pref_acc: float | None = None
    heldout_dpo_loss: float | None = None
    consensus_distance: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    payload_bytes: int = 0
    params_digest: str = ""
    params_probe: list[float] = field(default_factory=list)
    graph: str = ""
    spectral_gap: float = 1.0
    num_peers: int = 1
    neighbours: list[str] = field(default_factory=list)
    missing_neighbours: list[str] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    clipped: list[str] = field(default_factory=list)  # neighbours pulled in to the clip radius (robust averaging)
    clip_radius: float | None = None  # None: nothing could be clipped (plain averaging, too few neighbours)
    pull_ratio: float | None = None  # robust gossip: how far averaging moved us / sum_j W_ij ||x_j - x_i|| (dpo/bypass.py)
    routed_around: list[str] = field(default_factory=list)  # neighbours missing dpo.bypass_after rounds (dpo/bypass.py)
    user: int | str | None = None
    peer_id: str = ""
    seconds: float = 0.0
