"""Progress of a running node: one readable log line per round; a live status line on a TTY."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping

log = logging.getLogger("swarm_node.node")


def fmt(v: float | None, spec: str = ".3f") -> str:
    """A number for a table or log line; "-" for a value not measured (e.g. a round without eval)."""
    return "-" if v is None else format(v, spec)


def round_line(name: str, row: Mapping, total: int | None = None) -> str:
    r = row["round"]
    of = f"/{total}" if total else ""
    rej = sum((row.get("rejected") or {}).values())
    parts = [
        f"{name} round {r}{of}",
        f"reward {fmt(row.get('reward_mean'), '.3f')}",
        f"loss {fmt(row.get('loss'), '+.4f')}",
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


def dpo_round_line(name: str, row: Mapping, total: int | None = None) -> str:
    """The DPO node's log line: local loss, held-out preference accuracy, consensus, neighbours."""
    of = f"/{total}" if total else ""
    parts = [
        f"{name} round {row['round']}{of}",
        f"loss {fmt(row.get('dpo_loss'), '.4f')}",
        f"consensus {fmt(row.get('consensus_distance'), '.4f')}",
        f"neighbours {len(row.get('neighbours') or [])} missing {len(row.get('missing_neighbours') or [])}",
    ]
    if row.get("heldout_pref_acc") is not None:
        parts.append(f"held-out acc {row['heldout_pref_acc']:.3f}")
    parts.append(f"{row.get('seconds', 0):.2f}s")
    return " | ".join(parts)


class _ConsoleHandler(logging.Handler):
    """Writes log lines through the rich console that draws the progress bar, so they print above it.

    A plain StreamHandler writes to the terminal behind rich's back, and the next redraw of the bar
    overwrites the line it just wrote.
    """

    def __init__(self, console, formatter: logging.Formatter | None, level: int) -> None:
        super().__init__(level)
        self.console = console
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(self.format(record), markup=False, highlight=False, emoji=False, soft_wrap=True)
        except Exception:  # logging must never crash the node
            self.handleError(record)


class RoundProgress:
    """Logs each round; on an interactive terminal also keeps a rich progress bar at the bottom.

    While the bar is shown, the root logger's terminal handlers are replaced by one that prints through the
    bar's console (lines scroll above the bar), and put back on close.

    `describe` makes the log line of a metrics row (`round_line` for GRPO, `dpo_round_line` for DPO);
    `accuracy_key` names the row's held-out accuracy shown on the bar.
    """

    def __init__(self, name: str, total: int | None, describe: Callable[[str, Mapping, int | None], str] = round_line,
                 accuracy_key: str = "eval_accuracy"):
        self.name = name
        self.total = total
        self.describe = describe
        self.accuracy_key = accuracy_key
        self._progress = None
        self._swapped: list[tuple[logging.Handler, logging.Handler]] = []
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                      TimeElapsedColumn(), transient=True, console=Console(stderr=True))
            self._task = self._progress.add_task(name, total=total, info="starting")
            self._route_logs(self._progress.console)
            self._progress.start()

    def _route_logs(self, console) -> None:
        root = logging.getLogger()
        for h in list(root.handlers):
            if type(h) is logging.StreamHandler and getattr(h, "stream", None) in (sys.stderr, sys.stdout):
                repl = _ConsoleHandler(console, h.formatter, h.level)
                root.removeHandler(h)
                root.addHandler(repl)
                self._swapped.append((h, repl))

    def update(self, row: Mapping, done: int | None = None) -> None:
        """Log the round's line; move the bar to `done` rounds (default: the row's round number)."""
        log.info(self.describe(self.name, row, self.total))
        if self._progress is not None:
            acc = row.get(self.accuracy_key)
            info = f"round {row['round']}" + (
                f" reward {row['reward_mean']:.3f}" if row.get("reward_mean") is not None else "") + (
                f" acc {acc:.3f}" if acc is not None else "")
            self._progress.update(self._task, completed=row["round"] if done is None else done, info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        root = logging.getLogger()
        for original, repl in self._swapped:
            root.removeHandler(repl)
            root.addHandler(original)
        self._swapped = []
