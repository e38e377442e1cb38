"""Live per-peer table for the demo: round, reward, eval accuracy, groups in/out, filtered, rejected and,
when the peers' alone runs are done, each one's gain over alone so far with its SE.

Reads each peer's metrics.jsonl (the peers are separate processes). On a terminal it redraws a rich
table; otherwise it prints a compact line at most every few seconds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from swarm_node.node.metrics import read_metrics
from swarm_node.node.progress import fmt
from swarm_node.runs.stats import gain_with_se


def peer_status(rows: list[dict]) -> dict:
    last = rows[-1] if rows else {}
    evals = [r["eval_accuracy"] for r in rows if r.get("eval_accuracy") is not None]
    return {
        "round": last.get("round", 0),
        "reward": last.get("reward_mean"),
        "acc_start": evals[0] if evals else None,
        "acc": evals[-1] if evals else None,
        "ext_in": sum(r.get("external_groups") or 0 for r in rows),
        "out": sum(1 for r in rows if (r.get("bytes_out") or 0) > 0),
        "filtered": sum(r.get("filtered") or 0 for r in rows),
        "rejected": sum(sum((r.get("rejected") or {}).values()) for r in rows),
    }


def gain_so_far(rows: list[dict], alone_rows: list[dict]) -> dict | None:
    """The peer's latest eval minus its alone run's eval at the same round, with the SE paired per problem
    (gain_with_se); None before the first eval both runs share (the first, round 0, is the same model)."""
    alone = {r["round"]: r for r in alone_rows if r.get("eval_accuracy") is not None}
    for r in reversed(rows):
        a = alone.get(r.get("round")) if r.get("eval_accuracy") is not None else None
        if a is not None:
            if r["round"] == 0:
                return None
            g = gain_with_se(r["eval_accuracy"], a["eval_accuracy"], r.get("eval_hits"), a.get("eval_hits"),
                             r.get("eval_n"), a.get("eval_n"))
            return {"round": r["round"], **g}
    return None


def fmt_gain(g: dict | None, short: bool = False) -> str:
    if g is None:
        return "-"
    if short:
        return f"{g['gain']:+.2f}+-{g['se']:.2f}"
    return f"{g['gain']:+.3f} +- {g['se']:.3f} ({g['verdict']}, r{g['round']})"


class LiveTable:
    def __init__(self, title: str, peers: list, total_rounds: int, min_interval_s: float = 5.0,
                 baseline: dict[str, Path] | None = None):
        """baseline: each peer's alone metrics.jsonl (a finished run), for the gain-over-alone column."""
        self.title = title
        self.peers = peers
        self.total = total_rounds
        self.baseline = {name: read_metrics(path, warn=False) for name, path in (baseline or {}).items()
                         if Path(path).is_file()}
        self.tty = sys.stdout.isatty()
        self.min_interval_s = min_interval_s
        self._last_print = 0.0
        self._last_line = ""
        self._live = None

    def __enter__(self) -> LiveTable:
        if self.tty:
            from rich.live import Live

            self._live = Live(self._table(), refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(*exc)

    def _statuses(self) -> list[tuple[str, dict, bool]]:
        out = []
        for p in self.peers:
            rows = read_metrics(p.metrics, warn=False)
            status = peer_status(rows)
            if self.baseline:
                status["gain"] = gain_so_far(rows, self.baseline.get(p.name) or [])
            out.append((p.name, status, p.running()))
        return out

    def _table(self):
        from rich.table import Table

        t = Table(title=self.title, caption="gain over alone: this eval minus the peer's alone run at the same "
                  "round, +- its SE paired over the eval problems (one run)" if self.baseline else None)
        cols = ["peer", "round", "reward", "eval acc (start -> now)", *(["gain over alone"] if self.baseline else []),
                "groups in", "batches out", "filtered", "rejected", "state"]
        for col in cols:
            t.add_column(col, justify="right" if col != "peer" else "left")
        for name, s, running in self._statuses():
            gain = [fmt_gain(s.get("gain"))] if self.baseline else []
            t.add_row(name, f"{s['round']}/{self.total}", fmt(s["reward"]), f"{fmt(s['acc_start'])} -> {fmt(s['acc'])}",
                      *gain, str(s["ext_in"]), str(s["out"]), str(s["filtered"]), str(s["rejected"]),
                      "running" if running else "done")
        return t

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            return
        now = time.monotonic()
        parts = [f"{n} r{s['round']}/{self.total} reward {fmt(s['reward'], '.2f')} acc {fmt(s['acc'], '.2f')} "
                 + (f"gain {fmt_gain(s.get('gain'), short=True)} " if self.baseline else "")
                 + f"ext {s['ext_in']} filt {s['filtered']} rej {s['rejected']}" for n, s, _ in self._statuses()]
        line = "[demo] " + " | ".join(parts)
        if line != self._last_line and now - self._last_print >= self.min_interval_s:
            print(line, flush=True)
            self._last_print, self._last_line = now, line
