"""SIGINT/SIGTERM handling shared by the GRPO and DPO daemons.

The first signal asks the node to finish its round, checkpoint and leave the swarm; a second one stops at
once (KeyboardInterrupt). The previous handlers are restored on `restore()`, so a process that embeds a node
(tests, notebooks) keeps its own.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("swarm_node.node")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def where(frame: Any, depth: int = 6) -> str:
    """What the main thread was doing when the signal landed: its innermost swarm-node functions, outermost first.

    E.g. `run_round > step > _loss` for a signal inside the GRPO training step; tells an operator (and the
    fault tests) whether the node was generating, training, exchanging or idle when it was asked to stop.
    """
    names = []
    while frame is not None:
        code = frame.f_code
        if "swarm_node" in code.co_filename.replace("\\", "/").split("/") and code.co_name != "handler":
            names.append(code.co_name)
        frame = frame.f_back
    return " > ".join(reversed(names[:depth])) or "outside swarm-node code"


@dataclass
class StopFlag:
    """Set by SIGINT/SIGTERM; true once a stop was asked for."""

    event: threading.Event = field(default_factory=threading.Event)
    signal_name: str = ""
    _previous: dict = field(default_factory=dict)

    def install(self) -> StopFlag:
        """Install the handlers (main thread only; elsewhere the flag is only set by `set`)."""
        if threading.current_thread() is not threading.main_thread():
            return self

        def handler(signum: int, frame: Any) -> None:
            self.signal_name = signal.Signals(signum).name
            if self.event.is_set():
                raise KeyboardInterrupt
            log.info("%s received (in %s): finishing this round, then leaving (again to stop at once)",
                     self.signal_name, where(frame))
            self.event.set()

        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, handler)
        return self

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def set(self) -> None:
        self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()
