"""Reading a metrics.jsonl while its node appends to it: only the new bytes, only complete lines.

A node writes one JSON line per round. A reader that polls the file can catch the last line half written
(no newline yet): that part is left for the next read, not parsed. A complete line that is not JSON
(a crash cut it short, then the node restarted and appended) is skipped and counted, with its line
number, for the page to show. A node that resumes from an older checkpoint rewrites the file (fewer
rows, a new inode): the reader notices and reads it again from the start.

The first read of a long run's file is the page's first load (10,000 rows are ~12 MB of JSON), so new lines
are decoded in one call as one JSON array (one key string per key for all rows, no per-line decoder) with
the cyclic garbage collector paused, which halves that read; any batch that does not decode to exactly one
row per line is decoded again line by line, so a bad line is still found, numbered and skipped alone.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


def _null(_token: str) -> None:
    return None


# NaN/Infinity tokens (not strict JSON; MetricsWriter writes null) are read as null
_DECODER = json.JSONDecoder(parse_constant=_null)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection while thousands of row dicts are made at once (they are all kept: a collection
    would only walk them, again and again as the heap grows); reference counting still frees as usual."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _row(value: object) -> dict | None:
    return value if isinstance(value, dict) and isinstance(value.get("round", 0), int) else None


def _decode_line(line: bytes) -> dict | None:
    try:
        return _row(_DECODER.decode(line.decode()))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


DECODE_CHUNK_LINES = 256  # lines decoded per call: one C call holds the GIL (~10 ms for 256 rows, not ~100)


def decode_lines(lines: list[bytes]) -> list[dict | None]:
    """Each line's row, or None where a line is not a JSON object with an integer round.

    One decode of `[line,line,...]` per chunk of lines when each of them is one object (a node's file);
    otherwise that chunk line by line. A line cut short never joins the next into one valid value (a cut
    object lacks its closing bracket, and the array's end does not supply it), and the count check catches
    a line holding two values.
    """
    rows: list[dict | None] = []
    with gc_paused():
        for start in range(0, len(lines), DECODE_CHUNK_LINES):
            chunk = lines[start:start + DECODE_CHUNK_LINES]
            try:
                values = _DECODER.decode("[" + b",".join(chunk).decode() + "]")
            except (json.JSONDecodeError, UnicodeDecodeError):
                values = None
            got = [_row(v) for v in values] if isinstance(values, list) and len(values) == len(chunk) else []
            if got and all(r is not None for r in got):
                rows += got
            else:
                rows += [_decode_line(line) for line in chunk]
    return rows


MAX_LINE_BYTES = 1 << 20  # a metrics row is ~1-2 KB; a "line" longer than this is not one, and is skipped


@dataclass
class MetricsTail:
    """The rows of one metrics.jsonl so far; `poll()` reads what was appended since the last call."""

    path: Path
    rows: list[dict] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)  # 1-based numbers of complete lines that are not JSON
    version: int = 0  # bumped whenever rows change, so callers can cache what they derive from them
    _offset: int = 0
    _lines: int = 0
    _partial: bytes = b""
    _inode: tuple[int, int] | None = None

    def _reset(self) -> None:
        self.rows, self.bad_lines = [], []
        self._offset, self._lines, self._partial = 0, 0, b""
        self.version += 1

    def poll(self) -> bool:
        """Read new complete lines; True if rows changed. A missing file is no rows (not an error)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._inode is not None or self.rows:
                self._inode = None
                self._reset()
                return True
            return False
        inode = (st.st_dev, st.st_ino)
        changed = False
        if inode != self._inode or st.st_size < self._offset:  # replaced or truncated: start again
            if self._inode is not None:
                self._reset()
                changed = True
            self._inode = inode
        if st.st_size == self._offset:
            return changed
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(st.st_size - self._offset)
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if len(self._partial) > MAX_LINE_BYTES:  # never hold an endless "line" in memory
            self._lines += 1
            self.bad_lines.append(self._lines)
            self._partial = b""
        numbered = []  # (1-based line number, line) of the non-blank complete lines
        for line in complete:
            self._lines += 1
            if line.strip():
                numbered.append((self._lines, line))
        added = 0
        for (number, _), row in zip(numbered, decode_lines([line for _, line in numbered]), strict=True):
            if row is not None:
                self.rows.append(row)
                added += 1
            else:
                self.bad_lines.append(number)
        if added or complete:
            self.version += 1
        return changed or added > 0 or bool(complete)

    @property
    def pending_bytes(self) -> int:
        """Bytes of a last line still being written (no newline yet)."""
        return len(self._partial)
