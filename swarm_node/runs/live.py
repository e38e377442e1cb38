"""Live per-peer table for the demo: round, reward, eval accuracy, groups in/out, filtered, rejected.

Reads each peer's metrics.jsonl (the peers are separate processes). On a terminal it redraws a rich
table; otherwise it prints a compact line at most every few seconds.
"""

from __future__ import annotations

import sys
import time

from swarm_node.node.metrics import read_metrics
from swarm_node.node.progress import fmt


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


class LiveTable:
    def __init__(self, title: str, peers: list, total_rounds: int, min_interval_s: float = 5.0):
        self.title = title
        self.peers = peers
        self.total = total_rounds
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
        return [(p.name, peer_status(read_metrics(p.metrics, warn=False)), p.running()) for p in self.peers]

    def _table(self):
        from rich.table import Table

        t = Table(title=self.title)
        for col in ("peer", "round", "reward", "eval acc (start -> now)", "groups in", "batches out", "filtered",
                    "rejected", "state"):
            t.add_column(col, justify="right" if col != "peer" else "left")
        for name, s, running in self._statuses():
            t.add_row(name, f"{s['round']}/{self.total}", fmt(s["reward"]), f"{fmt(s['acc_start'])} -> {fmt(s['acc'])}",
                      str(s["ext_in"]), str(s["out"]), str(s["filtered"]), str(s["rejected"]),
                      "running" if running else "done")
        return t

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            return
        now = time.monotonic()
        parts = [f"{n} r{s['round']}/{self.total} reward {fmt(s['reward'], '.2f')} acc {fmt(s['acc'], '.2f')} "
                 f"ext {s['ext_in']} filt {s['filtered']} rej {s['rejected']}" for n, s, _ in self._statuses()]
        line = "[demo] " + " | ".join(parts)
        if line != self._last_line and now - self._last_print >= self.min_interval_s:
            print(line, flush=True)
            self._last_print, self._last_line = now, line
