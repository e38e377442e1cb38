"""The event-loop thread of a swarm peer: libp2p stream handlers, pushes and downloads run on it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

THREAD_NAME = "swarm-node-loop"


class LoopThread:
    """One uvloop event loop in a daemon thread.

    Owns: the loop, its thread, and the tasks started on it (kept referenced until they finish).
    May call: nothing of the swarm.
    Thread: `run`, `call_soon` and `submit` from any thread; `spawn` on the loop thread itself. After
    `stop_accepting` (the peer is closing) new work is dropped, but `run` still works, so shutdown
    coroutines can run before `stop`.
    """

    def __init__(self, name: str = THREAD_NAME) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._name = name
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task] = set()
        self.accepting = False

    def start(self) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=self._name, daemon=True)
        self._thread.start()
        self.accepting = True

    @property
    def running(self) -> bool:
        return self.loop is not None and self.loop.is_running()

    def run(self, coro: Coroutine, timeout: float) -> Any:
        """Run `coro` on the loop and wait for its result (from any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call_soon(self, fn: Callable, *args) -> None:
        """Call `fn(*args)` on the loop thread (from any thread); dropped once the peer is closing."""
        if self.accepting and self.loop is not None:
            self.loop.call_soon_threadsafe(fn, *args)

    def submit(self, coro: Coroutine) -> None:
        """Start `coro` as a task on the loop (from any thread); closed unstarted once the peer is closing."""
        if self.accepting and self.loop is not None:
            self.loop.call_soon_threadsafe(self.spawn, coro)
        else:
            coro.close()

    def spawn(self, coro: Coroutine) -> None:
        """On the loop thread: start `coro` as a task, referenced until it is done."""
        if not self.accepting:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop_accepting(self) -> None:
        self.accepting = False

    def stop(self, join_s: float = 5.0) -> None:
        self.accepting = False
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(join_s)
