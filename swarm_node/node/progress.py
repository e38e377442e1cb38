"""Progress of a running node: one readable log line per round; a live status line on a TTY."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("swarm_node.node")


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def round_line(name: str, row: dict, total: int | None = None) -> str:
    r = row["round"]
    of = f"/{total}" if total else ""
    rej = sum((row.get("rejected") or {}).values())
    parts = [
        f"{name} round {r}{of}",
        f"reward {_fmt(row.get('reward_mean'), '.3f')}",
        f"loss {_fmt(row.get('loss'), '+.4f')}",
        f"groups {row.get('local_groups', 0)}+{row.get('external_groups', 0)}ext",
        f"filtered {row.get('filtered', 0)}",
    ]
    if rej:
        parts.append(f"rejected {rej}")
    if row.get("eval_accuracy") is not None:
        parts.append(f"eval acc {row['eval_accuracy']:.3f}")
    parts.append(f"gen {row.get('gen_s', 0):.2f}s train {row.get('train_s', 0):.2f}s")
    if row.get("tokens_per_s"):
        parts.append(f"{row['tokens_per_s']:.0f} tok/s")
    return " | ".join(parts)


class RoundProgress:
    """Logs each round; on an interactive terminal also keeps a rich progress bar at the bottom."""

    def __init__(self, name: str, total: int | None):
        self.name = name
        self.total = total
        self._progress = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                      TimeElapsedColumn(), transient=True)
            self._task = self._progress.add_task(name, total=total, info="starting")
            self._progress.start()

    def update(self, row: dict) -> None:
        line = round_line(self.name, row, self.total)
        log.info(line)
        if self._progress is not None:
            acc = row.get("eval_accuracy")
            info = f"round {row['round']} reward {_fmt(row.get('reward_mean'), '.3f')}" + (
                f" acc {acc:.3f}" if acc is not None else "")
            self._progress.update(self._task, completed=row["round"], info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
