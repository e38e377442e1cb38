"""Rate-limited logging for lines a peer can cause, so a hostile peer cannot fill our logs at line rate.

Each line has a key chosen by our code (a rejection reason, never a peer-chosen string). A key may log
`burst` lines, then one more every `period_s / burst` seconds; what is held back is counted and reported
on the next line of that key ("... [N similar lines suppressed]"). The number of keys is bounded too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimitedLog:
    """A token bucket per key in front of a logger; thread-safe."""

    def __init__(self, logger: logging.Logger, *, burst: int = 5, period_s: float = 60.0, max_keys: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.burst = max(1, int(burst))
        self.rate = self.burst / max(period_s, 1e-9)  # tokens per second
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # key -> [tokens, last time, suppressed]
        self._lock = threading.Lock()
        self.suppressed_total = 0

    def allow(self, key: str) -> tuple[bool, int]:
        """(may log now, lines suppressed since this key last logged)."""
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = [float(self.burst), now, 0]
                self._buckets[key] = bucket
                while len(self._buckets) > self.max_keys:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(key)
                bucket[0] = min(float(self.burst), bucket[0] + (now - bucket[1]) * self.rate)
                bucket[1] = now
            if bucket[0] >= 1.0:
                bucket[0] -= 1.0
                held, bucket[2] = int(bucket[2]), 0
                return True, held
            bucket[2] += 1
            self.suppressed_total += 1
            return False, 0

    def log(self, level: int, key: str, msg: str, *args) -> bool:
        """Log `msg % args` at `level` unless `key` is over its budget; True if a line was written."""
        ok, held = self.allow(key)
        if not ok:
            return False
        if held:
            msg, args = msg + " [%d similar lines suppressed]", (*args, held)
        self.logger.log(level, msg, *args)
        return True

    def warning(self, key: str, msg: str, *args) -> bool:
        return self.log(logging.WARNING, key, msg, *args)
