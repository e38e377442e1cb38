"""Per-round metrics: one JSON line per round in metrics.jsonl, and an opt-in Prometheus endpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

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
        keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln).get("round", 0) <= round_]
        self.path.write_text("".join(ln + "\n" for ln in keep))

    def write(self, row: dict) -> None:
        row = _clean(row)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row, sort_keys=False) + "\n")
        if self._prom is not None:
            self._export(row)

    def _export(self, row: dict, prefix: str = "swarm_node_") -> None:
        for key, value in row.items():
            if isinstance(value, dict):
                self._export({f"{key}_{k}": v for k, v in value.items()}, prefix)
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
    for line in p.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
