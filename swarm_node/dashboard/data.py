"""The page's data: every peer found under the watched dirs, its report numbers and its series, as JSON.

Files are polled when the page asks (at most every `min_poll_s`), each read only from where the last read
stopped (tail.py); a peer's numbers are recomputed only when its rows changed. Problems with the input
(a missing or empty dir, lines that are not JSON) become one line each in `problems`, for the page to show.

The first document of a long run is the page's first load: it reads every file whole (tail.py decodes them a
chunk of lines per call), computes every peer's numbers with the cyclic collector paused (the new rows are all kept, so
collecting would only walk them); the page asks for it first thing, while the browser still loads its
scripts (page.html).
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

from swarm_node.dashboard.layout import ARMS, EXPECTED, NODE_ARM, metrics_files
from swarm_node.dashboard.summary import peer_series, peer_summary
from swarm_node.dashboard.tail import MetricsTail, gc_paused

MAX_BAD_LINES_SHOWN = 3


def _finite(v):
    """Strict JSON for the browser: NaN/inf become null (JSON.parse refuses NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


class RunWatcher:
    """Watches run dirs (node state dirs or demo dirs) and serves their numbers as one JSON document."""

    def __init__(self, dirs: list[Path], *, title: str | None = None, swarm=None, min_poll_s: float = 0.5,
                 max_points: int = 2000):
        self.dirs = [Path(d) for d in dirs]
        self.title = title or ", ".join(d.name or str(d) for d in self.dirs)
        self.swarm = swarm  # a SwarmWatch, or None
        self.min_poll_s = min_poll_s
        self.max_points = max_points
        self._tails: dict[tuple[int, str, str], MetricsTail] = {}
        self._views: dict[tuple[int, str, str], tuple[int, dict]] = {}
        self._lock = threading.Lock()
        self._polled = 0.0
        self._doc: bytes | None = None

    def _labels(self) -> list[str]:
        """A short label per dir, to tell peers of two dirs apart (only used with several dirs)."""
        names = [d.resolve().name or str(d) for d in self.dirs]
        return names if len(set(names)) == len(names) else [str(d) for d in self.dirs]

    def _poll(self) -> list[str]:
        problems: list[str] = []
        for i, d in enumerate(self.dirs):
            if not d.exists():
                problems.append(f"{d}: no such directory (yet); waiting for it")
                continue
            if not d.is_dir():
                problems.append(f"{d}: not a directory; give {EXPECTED}")
                continue
            files = metrics_files(d)
            if not files:
                problems.append(f"{d}: no metrics.jsonl yet; waiting for {EXPECTED}")
            for arm, peers in files.items():
                for peer, path in peers.items():
                    tail = self._tails.get((i, arm, peer))
                    if tail is None:
                        tail = self._tails[(i, arm, peer)] = MetricsTail(path)
                    try:
                        tail.poll()
                    except OSError as exc:  # unreadable (permissions, a file being replaced): say so, keep going
                        problems.append(f"{path}: cannot read ({exc.strerror or exc})")
                    if tail.bad_lines:
                        shown = ", ".join(str(n) for n in tail.bad_lines[:MAX_BAD_LINES_SHOWN])
                        more = len(tail.bad_lines) - MAX_BAD_LINES_SHOWN
                        problems.append(f"{path}: line{'s' if len(tail.bad_lines) > 1 else ''} {shown}"
                                        f"{f' and {more} more' if more > 0 else ''} not valid JSON; skipped")
        return problems

    def _peer(self, key: tuple[int, str, str], tail: MetricsTail, label: str, now: float) -> dict:
        cached = self._views.get(key)
        if cached is None or cached[0] != tail.version:
            rows = tail.rows
            view = {"summary": peer_summary(rows), **peer_series(rows, self.max_points)}
            self._views[key] = cached = (tail.version, view)
        _, arm, peer = key
        view = cached[1]
        model = (view["summary"].get("model") or {})
        last_time = view.get("time")
        return {
            "id": f"{label}/{arm}/{peer}" if len(self.dirs) > 1 else f"{arm}/{peer}",
            "name": peer, "arm": arm, "dir": label, "model": model.get("name") if isinstance(model, dict) else None,
            "rows": len(tail.rows), "writing": tail.pending_bytes > 0,
            "seconds_since_row": round(now - last_time, 1) if isinstance(last_time, int | float) else None,
            **{k: v for k, v in view.items() if k != "time"},
        }

    def warm_up(self) -> None:
        """Read the files and compute every peer's numbers now, in a thread, so the first page load is quick."""
        threading.Thread(target=self.document, name="dashboard-warm-up", daemon=True).start()

    def document(self) -> bytes:
        """The page's JSON (utf-8); files are polled at most every min_poll_s, peers recomputed only on new rows."""
        with self._lock, gc_paused():
            now = time.time()
            if self._doc is None or now - self._polled >= self.min_poll_s:
                problems = self._poll()
                self._polled = now
                labels = self._labels()
                order = {arm: i for i, arm in enumerate((*ARMS, NODE_ARM))}  # swarm before alone, as in the report
                keys = sorted(self._tails, key=lambda k: (k[0], order.get(k[1], 9), k[2]))
                peers = [self._peer(key, self._tails[key], labels[key[0]], now) for key in keys]
                swarm = self.swarm.snapshot() if self.swarm is not None else None
                doc = {"title": self.title, "generated": now, "dirs": [str(d) for d in self.dirs],
                       "single_node": all(p["arm"] == NODE_ARM for p in peers) and bool(peers),
                       "problems": problems, "peers": peers, "swarm": swarm}
                text = json.dumps(doc)
                if "NaN" in text or "Infinity" in text:  # a computed non-finite number (or a name holding one)
                    text = json.dumps(_finite(doc), allow_nan=False)
                self._doc = text.encode()
            return self._doc
