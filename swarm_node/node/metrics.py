"""Per-round metrics: one JSON line per round in metrics.jsonl, an opt-in Prometheus endpoint, optional trackers.

A metrics write never stops training. A row that cannot be appended (disk full, I/O error) is cut back off
the file, so no torn line is left for the next row to glue onto, and held in memory (up to MAX_HELD_ROWS,
the oldest dropped beyond that, counted); every later write tries the held rows first, so once space returns
they land in order. Failures are counted and logged rate-limited. A tracker that fails is logged the same way.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swarm_node.dashboard.server import serve_dirs
from swarm_node.node import reasons
from swarm_node.swarm.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

MAX_HELD_ROWS = 1000
"""Rows kept in memory while metrics.jsonl cannot be written (a row is 1-3 KB: a few MB at most); beyond that
the oldest are dropped and counted (`rows_dropped`)."""


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write null instead, so every line parses with a strict reader."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


# per-round counts: exported as Prometheus counters (running totals), the rest of the numbers as gauges
COUNTED_FIELDS = frozenset({
    "local_groups", "external_groups", "filtered", "filtered_external", "kept", "zero_advantage_groups",
    "rewards_overridden", "bytes_out", "bytes_in", "bytes_sent", "bytes_received",
})


class MetricsWriter:
    """Appends one JSON row per round to STATE_DIR/metrics.jsonl and mirrors it to Prometheus and trackers."""

    def __init__(self, state_dir: Path, prometheus_port: int | None = None, node_name: str = "node", *,
                 prometheus_host: str = "127.0.0.1", trackers: list | None = None,
                 allowed_hosts: list[str] | tuple[str, ...] = ()):
        self.path = Path(state_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.node_name = node_name
        self.trackers = list(trackers or [])
        self._held: deque[tuple[Any, bytes]] = deque()  # (round, line) of rows not yet on disk, oldest first
        self._cut_to: int | None = None  # where a failed append must be cut back to, if even that failed
        self._failing = False  # the last append failed
        self.write_failures = 0  # appends to metrics.jsonl that failed (disk full, I/O error)
        self.rows_dropped = 0  # rows lost for good: more than MAX_HELD_ROWS were held
        self.tracker_failures = 0
        self._warn = RateLimitedLog(log, burst=3, period_s=300.0)
        self._series: dict[str, Any] = {}
        self._prom = None
        self._server = None
        self.page_url: str | None = None
        if prometheus_port:
            import prometheus_client as prom

            self._prom = prom
            self._registry = prom.CollectorRegistry()
            # /metrics beside the dashboard page of this state dir at / (swarm_node.dashboard)
            self._server, self.page_url = serve_dirs(
                [self.path.parent], prometheus_port, host=prometheus_host, title=node_name,
                what="metrics.prometheus_port", metrics_app=prom.make_wsgi_app(self._registry),
                allowed_hosts=allowed_hosts)
            log.info("serving the dashboard page at %s and Prometheus metrics at %smetrics%s", self.page_url,
                     self.page_url, " (every interface)" if prometheus_host in ("0.0.0.0", "::", "") else "")
            self._prom.Info("swarm_node", "node this endpoint belongs to", registry=self._registry).info(
                {"node": node_name})

    @classmethod
    def from_config(cls, state_dir: Path, cfg: Any, node_name: str) -> MetricsWriter:
        """From a NodeConfig: Prometheus per `metrics.prometheus_*`, trackers per `metrics.report_to`."""
        from swarm_node.node.trackers import make_trackers

        m = cfg.metrics
        trackers = make_trackers(m.report_to, Path(state_dir), node_name=node_name,
                                 tensorboard_dir=m.tensorboard_dir, wandb_project=m.wandb_project,
                                 config=cfg.model_dump(mode="json")) if m.report_to else []
        return cls(state_dir, m.prometheus_port, node_name, prometheus_host=m.prometheus_host, trackers=trackers,
                   allowed_hosts=m.allowed_hosts)

    def truncate_after(self, round_: int) -> None:
        """On (re)start: drop rows of rounds that the restored checkpoint does not contain (all rows: -1), and a
        last line cut short by a crash (one that parses is kept, with its newline), so the next row starts on
        a line of its own.

        Nothing is lost: the whole previous file is kept beside it first, and the move is logged.
        """
        if not self.path.exists():
            return
        rows = read_metrics(self.path)
        keep = [r for r in rows if r.get("round", 0) <= round_]
        torn = _ends_mid_line(self.path)
        if len(keep) == len(rows) and not torn:
            return
        backup = self.path.with_name(f"metrics.jsonl.{time.strftime('%Y%m%d-%H%M%S')}.bak")
        n = 1
        while backup.exists():
            n += 1
            backup = self.path.with_name(f"metrics.jsonl.{time.strftime('%Y%m%d-%H%M%S')}-{n}.bak")
        shutil.copy2(self.path, backup)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        os.replace(tmp, self.path)
        if round_ < 0 and rows:
            log.warning("no checkpoint to resume from in %s: starting at round 0; the %d rows of the previous run "
                        "were moved out of metrics.jsonl into %s", self.path.parent, len(rows), backup.name)
        elif len(keep) < len(rows):
            log.warning("resuming at round %d: dropped %d metrics.jsonl rows of later rounds (not in the checkpoint); "
                        "the previous file is kept as %s", round_, len(rows) - len(keep), backup.name)
        else:
            log.warning("metrics.jsonl ended in a line cut short (a crash while it was written): it now ends at "
                        "the last whole row; the previous file is kept as %s", backup.name)

    def write(self, row: Mapping[str, Any]) -> None:
        """Append a round's row (a node.rows row, or a plain dict) and mirror it; never raises for the disk."""
        row = _clean(row.to_json() if hasattr(row, "to_json") else dict(row))
        self._held.append((row.get("round"), (json.dumps(row, sort_keys=False) + "\n").encode()))
        if len(self._held) > MAX_HELD_ROWS:
            self._held.popleft()
            self.rows_dropped += 1
        self._write_held()
        if self._prom is not None:
            self._export(row)
        for tracker in self.trackers:
            try:
                tracker.log(row, step=int(row.get("round", 0)))
            except Exception as exc:  # a tracker (its disk, its network) must never stop training
                self.tracker_failures += 1
                self._warn.warning(f"tracker:{type(tracker).__name__}", "%s could not log round %s (%s: %s); "
                                   "the node keeps training (%d tracker failures so far)", type(tracker).__name__,
                                   row.get("round"), type(exc).__name__, str(exc)[:200], self.tracker_failures)

    @property
    def held_rows(self) -> int:
        """Rows waiting in memory for metrics.jsonl to be writable again."""
        return len(self._held)

    def _write_held(self) -> bool:
        """Append every held row in one write, or none of them; True when nothing is held any more."""
        if not self._held:
            return True
        try:
            _append(self.path, b"".join(line for _r, line in self._held), self._cut_to)
        except OSError as exc:
            self._cut_to = getattr(exc, "cut_to", self._cut_to)
            self._failing = True
            self.write_failures += 1
            if self._prom is not None:
                self._metric("counter", "swarm_node_metrics_write_failures", "appends to metrics.jsonl that "
                             "failed (disk full, I/O error)").labels(self.node_name).inc()
            self._warn.warning("metrics:write", "metrics.jsonl: rows of rounds %s..%s not written (%s): held in "
                               "memory until they can be (at most %d; %d failed writes, %d rows dropped so far); "
                               "the node keeps training", self._held[0][0], self._held[-1][0], _errno_text(exc),
                               MAX_HELD_ROWS, self.write_failures, self.rows_dropped)
            return False
        if self._failing:
            log.warning("metrics.jsonl is writable again: %d held rows written (%d failed writes, %d rows dropped "
                        "in all)", len(self._held), self.write_failures, self.rows_dropped)
        self._cut_to, self._failing = None, False
        self._held.clear()
        return True

    def close(self) -> None:
        """Write the held rows if the disk lets us now, finish the trackers' runs and stop serving /metrics.
        Idempotent."""
        if self._held and not self._write_held():
            log.error("metrics.jsonl: the rows of rounds %s..%s could not be written before exit (is the disk still "
                      "full?); they are lost", self._held[0][0], self._held[-1][0])
            self._held.clear()
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as exc:  # a tracker failing at exit must not hide the run's own outcome
                log.warning("closing %s failed: %s", type(tracker).__name__, exc)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _metric(self, kind: str, name: str, doc: str, labels: tuple[str, ...] = ("node",)) -> Any:
        m = self._series.get(name)
        if m is None:
            cls = self._prom.Counter if kind == "counter" else self._prom.Gauge
            m = self._series[name] = cls(name, doc, labels, registry=self._registry)
        return m

    def _export(self, row: dict, prefix: str = "swarm_node_") -> None:
        """Counters for what a round counts (groups, sequences, bytes, rejections by reason), gauges for the rest.

        Every series has a `node` label. Per-round dicts keyed by names that peers choose (groups by peer)
        stay in metrics.jsonl only: exporting them would let peers grow the label set without bound; so do
        rejection reasons outside this node's registry (node/reasons.py).
        """
        node = self.node_name
        self._metric("counter", prefix + "rounds", "rounds completed (round 0 = the initial eval)").labels(node).inc()
        for reason, n in (row.get("rejected") or {}).items():
            if reasons.known(reason):
                self._metric("counter", prefix + "rejected", "peer batches or groups declined, by reason",
                             ("node", "reason")).labels(node, reason).inc(int(n))
        for phase, seconds in (row.get("time_split_s") or {}).items():  # fixed phase names (node/timing.py)
            self._metric("gauge", prefix + "round_phase_seconds", "last round's seconds per phase",
                         ("node", "phase")).labels(node, phase).set(float(seconds))
        for key, value in row.items():
            if isinstance(value, dict) or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            name = prefix + "".join(c if c.isalnum() else "_" for c in key)
            if key in COUNTED_FIELDS:
                self._metric("counter", name, f"total of the per-round {key}").labels(node).inc(max(0, value))
            else:
                self._metric("gauge", name, f"last round's {key}").labels(node).set(float(value))


def _append(path: Path, data: bytes, cut_to: int | None) -> None:
    """Append `data` to `path` whole, or leave the file as it was.

    A write that fails part way (ENOSPC after a short write) is cut back off, so the next append starts on
    a line of its own. If even that cut fails, the OSError raised carries `cut_to`, the size to cut the file
    back to before the next append (pass it in then); `cut_to` None on it: the file is as it was.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if cut_to is not None:
            os.ftruncate(fd, cut_to)  # a failed append's tail that could not be cut back then
        start = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            exc.cut_to = None
            try:
                os.ftruncate(fd, start)
            except OSError:
                exc.cut_to = start
            raise
    finally:
        os.close(fd)


def _errno_text(exc: OSError) -> str:
    return f"[Errno {exc.errno}] {os.strerror(exc.errno)}" if exc.errno else str(exc)[:200]


def _ends_mid_line(path: Path) -> bool:
    """The file's last byte is not a newline (a write was cut short)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def read_metrics(path: Path, warn: bool = True) -> list[dict]:
    """Rows of a metrics.jsonl; a line that is not a JSON object (cut short by a crash, being written by a
    live node while the demo's table reads it, or edited by hand) is skipped, with a warning unless `warn`
    is False."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif warn:
            log.warning("%s: line %d is not a JSON object; skipped", p, n)
    return rows
