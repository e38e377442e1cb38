"""Per-round metrics: one JSON line per round in metrics.jsonl, and an opt-in Prometheus endpoint."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# reasons named by this node's code (peers cannot invent new ones); protocol:* and swarm:* come from
# fixed lists in swarm_node.protocol.errors and swarm_node.swarm
REJECT_REASONS_EXPORTED = frozenset({
    "swarm_mismatch", "task_mismatch", "tokenizer_mismatch", "vocab_mismatch", "unknown_prompt",
    "prompt_mismatch", "group_too_small", "duplicate_group", "reward_out_of_range", "stale", "round_mismatch",
    "oom_external", "duplicate_completion", "replayed_group", "share_capped", "logprob_outlier",
})

GRPO_FIELDS = (
    "round", "reward_mean", "loss", "local_groups", "external_groups", "filtered", "tokens_per_s",
    "gen_s", "train_s", "eval_accuracy",
)


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write null instead, so every line parses with a strict reader."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


class MetricsWriter:
    def __init__(self, state_dir: Path, prometheus_port: int | None = None, node_name: str = "node"):
        self.path = Path(state_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._gauges: dict[str, Any] = {}
        self._rejected_total: dict[str, int] = {}
        self._prom = None
        if prometheus_port:
            import prometheus_client as prom

            self._prom = prom
            self._registry = prom.CollectorRegistry()
            prom.start_http_server(prometheus_port, registry=self._registry)
        self.node_name = node_name

    def truncate_after(self, round_: int) -> None:
        """On resume: drop rows of rounds that the restored checkpoint does not contain."""
        if not self.path.exists():
            return
        keep = [json.dumps(r) for r in read_metrics(self.path) if r.get("round", 0) <= round_]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(ln + "\n" for ln in keep))
        os.replace(tmp, self.path)

    def write(self, row: dict) -> None:
        row = _clean(row)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row, sort_keys=False) + "\n")
        if self._prom is not None:
            self._export(row)

    def _export(self, row: dict, prefix: str = "swarm_node_") -> None:
        """Gauges for the round's top-level numbers; `rejected` as running totals by reason.

        Other per-round dicts (e.g. groups by peer) are keyed by names that peers choose, so they stay in
        metrics.jsonl only: exporting them would let peers grow the label set without bound.
        """
        for reason, n in (row.get("rejected") or {}).items():
            self._rejected_total[reason] = self._rejected_total.get(reason, 0) + int(n)
        totals = {f"rejected_total_{k}": v for k, v in self._rejected_total.items() if k in REJECT_REASONS_EXPORTED
                  or k.startswith(("protocol:", "swarm:"))}
        for key, value in {**row, **totals}.items():
            if isinstance(value, dict):
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or value is None:
                continue
            name = prefix + "".join(c if c.isalnum() else "_" for c in key)
            g = self._gauges.get(name)
            if g is None:
                g = self._gauges[name] = self._prom.Gauge(name, f"last value of {key}", registry=self._registry)
            g.set(float(value))


def read_metrics(path: Path) -> list[dict]:
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash or a full disk
            log.warning("%s: line %d is not valid JSON; skipped", p, n)
    return rows
