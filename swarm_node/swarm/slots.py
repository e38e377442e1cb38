"""Download slots: how many downloads run at once, and who gets a slot that frees.

A plain semaphore hands slots out first come, first served, so identities that announce a batch and then
never deliver it (a new identity costs nothing) filled every slot ahead of the peers a node already
trusts, and a queue of them delayed an honest batch past its age limit. Here waiters are served in the
order of a key (lower first: the node's rank of the peer, then its recent failed downloads, then arrival),
and downloads from *strangers* (peers ranked above 0: not yet established) hold at most `stranger_slots`
of the slots at once, so a peer ranked 0 always finds a slot free of strangers.

Pure asyncio bookkeeping, no networking. Thread: the event loop it is used on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(order=True)
class _Waiter:
    key: tuple
    seq: int
    stranger: bool = field(compare=False)
    future: asyncio.Future = field(compare=False)


class DownloadSlots:
    """At most `total` holders, at most `stranger_slots` of them strangers; the best-keyed waiter first."""

    def __init__(self, total: int, stranger_slots: int) -> None:
        self.total = max(1, int(total))
        self.stranger_slots = max(1, min(int(stranger_slots), self.total))
        self.held = 0
        self.strangers_held = 0
        self._waiting: dict[bool, list[_Waiter]] = {False: [], True: []}  # by stranger, each a heap
        self._seq = itertools.count()

    async def acquire(self, key: tuple, stranger: bool) -> None:
        """Wait for a slot; `key` orders the waiters (lower first), `stranger` counts against the strangers'
        share. A cancelled wait holds nothing."""
        waiter = _Waiter(key, next(self._seq), stranger, asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting[stranger], waiter)
        self._grant()
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(stranger)  # granted just as it was cancelled: hand the slot on
            raise

    def release(self, stranger: bool) -> None:
        self.held -= 1
        self.strangers_held -= stranger
        self._grant()

    def waiting(self) -> int:
        return sum(1 for heap in self._waiting.values() for w in heap if not w.future.done())

    def _best(self, stranger: bool) -> _Waiter | None:
        heap = self._waiting[stranger]
        while heap and heap[0].future.done():  # cancelled while waiting
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _grant(self) -> None:
        """Give free slots to the best waiters; a stranger waits while strangers hold their share."""
        while self.held < self.total:
            known = self._best(False)
            stranger = self._best(True) if self.strangers_held < self.stranger_slots else None
            w = min((x for x in (known, stranger) if x is not None), default=None)
            if w is None:
                return
            heapq.heappop(self._waiting[w.stranger])
            self.held += 1
            self.strangers_held += w.stranger
            w.future.set_result(None)
