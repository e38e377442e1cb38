"""Prompt ids as a per-batch table of templates plus a column of numbers.

Task ids are a fixed text with a few numbers in it (`arith:id:97-69`, `gsm8k:train:1234`), so sending
each id as a string repeats the text every group and spells the numbers out in ASCII. Here each id is
split into a template, its text with every canonical decimal run (no leading zero, at most 9 digits, the
first MAX_NUMBERS of them) replaced by HOLE, and those numbers; the body carries the distinct templates
once, a template index per group and one column of all the numbers. Every valid id survives
exactly: decoding puts str(n) back into each hole. A decoded id is only a claim: the receiver rebuilds
the prompt from it and checks it against the prompt's token ids (grpo/rollouts.py).
"""

from __future__ import annotations

import re

import numpy as np

from .errors import ProtocolError

# Lone surrogates: no valid id holds one (ids must encode as utf-8), so neither can clash with an id's text.
# The body carries them with utf-8's "surrogatepass" handler; a filled-in id must then encode strictly.
HOLE = "\ud800"
END = "\udbff"  # ends each template in the body's `pt` bytes
ENCODING = ("utf-8", "surrogatepass")
MAX_NUMBERS = 8  # numbers taken out of one id; later digit runs stay in its template
_RUN = re.compile(r"[0-9]+")


def split_id(pid: str) -> tuple[str, list[int]]:
    """'arith:id:97-69' -> ('arith:id:<HOLE>-<HOLE>', [97, 69]); `pid` is a checked id (valid utf-8)."""
    parts, numbers, pos = [], [], 0
    for m in _RUN.finditer(pid):
        s = m.group()
        if len(numbers) < MAX_NUMBERS and len(s) <= 9 and (s == "0" or s[0] != "0"):
            parts.append(pid[pos : m.start()])
            numbers.append(int(s))
            pos = m.end()
    parts.append(pid[pos:])
    return HOLE.join(parts), numbers


def encode_ids(pids: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(distinct templates in order of first use, template index per id, all numbers in id order)."""
    table: dict[str, int] = {}
    index, numbers = [], []
    for pid in pids:
        template, nums = split_id(pid)
        index.append(table.setdefault(template, len(table)))
        numbers += nums
    return list(table), np.array(index, dtype=np.int64), np.array(numbers, dtype=np.int64)


def check_templates(templates: list[str], max_bytes: int) -> np.ndarray:
    """Each template within `max_bytes` (its holes count as 3 bytes); returns the number of holes of each,
    more than MAX_NUMBERS being a schema error."""
    for t in templates:
        if len(t.encode(*ENCODING)) > max_bytes:
            raise ProtocolError("string_too_long", f"a prompt-id template over {max_bytes} bytes")
    n = np.array([t.count(HOLE) for t in templates], dtype=np.int64)
    if n.size and int(n.max()) > MAX_NUMBERS:
        raise ProtocolError("schema", f"a prompt-id template has more than {MAX_NUMBERS} holes")
    return n


def decode_ids(templates: list[str], index: np.ndarray, numbers: np.ndarray) -> list[str]:
    """Fill each id's template with its numbers (len(numbers) == holes(templates)[index].sum() is checked
    by the caller before `numbers` is read)."""
    pieces = [t.split(HOLE) for t in templates]
    out, k = [], 0
    text = [str(int(n)) for n in numbers.tolist()]
    for i in index.tolist():
        p = pieces[i]
        h = len(p) - 1
        out.append(p[0] + "".join(text[k + j] + p[j + 1] for j in range(h)))
        k += h
    return out
