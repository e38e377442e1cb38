"""Align two tokenisations of one completion on their common byte boundaries (numpy only, no models).

A generator (another family's peer) and a learner tokenise the same completion text differently. A byte
offset where a token of *each* side ends is a common boundary; the text between two consecutive common
boundaries is a segment. Every segment holds a contiguous run of tokens of each side, so both sides'
log-probabilities can be summed per segment and compared (training/segments.py, docs/algorithms.md
"Segment ratio"). Boundaries are bytes, not characters: a byte-fallback or byte-level token may end inside a
UTF-8 character, and that offset is a boundary like any other.

Zero-width tokens (special tokens: the stop/eos, a marker mid-text) carry no bytes, so they are placed by
rule:
- one at an offset before the end of the text joins the segment of the bytes that follow it;
- trailing ones (offset = the text's end) form an end segment of their own when *both* sides have one (the
  usual "finished" completion: the generator's stop and the learner's eos face each other); when only one
  side has them they join the last segment; an empty text must then have tokens on both sides or on neither
  (otherwise ``TilingError('unmatched_end')``).

Offsets that do not tile the text (negative, decreasing, not ending at the text's length) raise
``TilingError``, a ``ValueError`` whose ``reason`` admission can count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# TilingError.reason values (short names a caller may count as rejection reasons).
TILING_REASONS: tuple[str, ...] = ("offsets_malformed", "offsets_decreasing", "offsets_not_covering", "unmatched_end")


class TilingError(ValueError):
    """Token byte offsets that do not tile the completion text; ``reason`` is one of TILING_REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Alignment:
    """Segments of one completion: segment k holds generator tokens ``gen_bounds[k]:gen_bounds[k+1]`` and
    learner tokens ``learner_bounds[k]:learner_bounds[k+1]`` (each at least one token), and ends at byte
    ``byte_ends[k]`` (the end segment of zero-width tokens ends at the text's end, like the one before it).
    ``end_segment``: the last segment is both sides' trailing zero-width tokens (a finished completion)."""

    gen_bounds: np.ndarray
    learner_bounds: np.ndarray
    byte_ends: np.ndarray
    n_bytes: int
    end_segment: bool

    @property
    def n_segments(self) -> int:
        return len(self.gen_bounds) - 1

    @property
    def n_gen(self) -> int:
        return int(self.gen_bounds[-1])

    @property
    def n_learner(self) -> int:
        return int(self.learner_bounds[-1])

    def gen_segments(self) -> np.ndarray:
        """Segment index of each generator token (int64, non-decreasing from 0)."""
        return np.repeat(np.arange(self.n_segments, dtype=np.int64), np.diff(self.gen_bounds))

    def learner_segments(self) -> np.ndarray:
        """Segment index of each learner token (int64, non-decreasing from 0)."""
        return np.repeat(np.arange(self.n_segments, dtype=np.int64), np.diff(self.learner_bounds))

    @property
    def is_identity(self) -> bool:
        """Every segment is one token on each side (same tokenisation): per-token F-TIS."""
        return self.n_gen == self.n_learner == self.n_segments


def ends_from_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Cumulative byte ends of tokens given their byte lengths (the wire carries lengths)."""
    lens = _as_int_array(lengths, "lengths")
    if lens.size and int(lens.min()) < 0:
        raise TilingError("offsets_malformed", "negative token length")
    return np.cumsum(lens, dtype=np.int64)


def ends_from_spans(spans: Sequence[tuple[int, int]] | np.ndarray) -> np.ndarray:
    """Cumulative byte ends from (start, end) byte spans, which must follow each other without gap or
    overlap from byte 0 (a tokenizer's byte offset mapping)."""
    arr = _as_int_array(spans, "spans", ndim=2)
    if arr.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    starts, ends = arr[:, 0], arr[:, 1]
    expected = np.concatenate(([0], ends[:-1]))
    if not np.array_equal(starts, expected):
        raise TilingError("offsets_not_covering", "spans leave a gap or overlap")
    if bool((ends < starts).any()):
        raise TilingError("offsets_decreasing", "a span ends before it starts")
    return ends.copy()


def align(n_bytes: int, gen_ends: Sequence[int] | np.ndarray, learner_ends: Sequence[int] | np.ndarray) -> Alignment:
    """Segments of a completion of ``n_bytes`` bytes between the common byte boundaries of two tokenisations,
    each given as the cumulative byte end of every token (equal consecutive ends = a zero-width token).

    O((m + n) log(m + n)) for m generator and n learner tokens; raises TilingError on offsets that do not
    tile the text.
    """
    if not isinstance(n_bytes, int | np.integer) or n_bytes < 0:
        raise TilingError("offsets_malformed", f"text length {n_bytes!r}")
    total = int(n_bytes)
    eg = _checked_ends(gen_ends, total, "generator")
    el = _checked_ends(learner_ends, total, "learner")
    wg = np.diff(eg, prepend=0)
    wl = np.diff(el, prepend=0)
    # content boundaries: 0, the end, and every offset where a non-empty token of each side ends
    bounds = np.union1d(np.array([0, total], dtype=np.int64), np.intersect1d(eg[wg > 0], el[wl > 0]))
    n_content = len(bounds) - 1
    trail_g = _trailing_zero_width(wg, eg, total)
    trail_l = _trailing_zero_width(wl, el, total)
    end_segment = trail_g > 0 and trail_l > 0
    if n_content == 0 and not end_segment and (len(eg) or len(el)):
        raise TilingError("unmatched_end", "empty text with zero-width tokens on one side only")
    sg = _segment_of(eg, wg, bounds, total, n_content, end_segment)
    sl = _segment_of(el, wl, bounds, total, n_content, end_segment)
    k = n_content + int(end_segment)
    seg_ids = np.arange(k + 1)
    byte_ends = np.concatenate((bounds[1:], [total] if end_segment else [])).astype(np.int64)
    return Alignment(
        gen_bounds=np.searchsorted(sg, seg_ids, "left").astype(np.int64),
        learner_bounds=np.searchsorted(sl, seg_ids, "left").astype(np.int64),
        byte_ends=byte_ends,
        n_bytes=total,
        end_segment=end_segment,
    )


def _segment_of(
    ends: np.ndarray, widths: np.ndarray, bounds: np.ndarray, total: int, n_content: int, end_segment: bool
) -> np.ndarray:
    """Segment of each token: a non-empty token ending at e lies in the content segment (B[k-1], B[k]] that
    holds e; a zero-width one at offset o < total joins the segment of byte o+1; trailing zero-width tokens go
    to the end segment if there is one, else to the last content segment."""
    starts = ends - widths
    seg = np.where(widths > 0, np.searchsorted(bounds, ends, "left"), np.searchsorted(bounds, starts, "right")) - 1
    trailing = (widths == 0) & (starts == total)
    return np.where(trailing, n_content if end_segment else n_content - 1, seg).astype(np.int64)


def _trailing_zero_width(widths: np.ndarray, ends: np.ndarray, total: int) -> int:
    return int(((widths == 0) & (ends == total)).sum())


def _checked_ends(ends: Sequence[int] | np.ndarray, total: int, side: str) -> np.ndarray:
    arr = _as_int_array(ends, f"{side} ends")
    if arr.size == 0:
        if total:
            raise TilingError("offsets_not_covering", f"{side} has no token for {total} bytes")
        return arr
    if int(arr[0]) < 0:
        raise TilingError("offsets_malformed", f"{side} offset below 0")
    if arr.size > 1 and bool((np.diff(arr) < 0).any()):
        raise TilingError("offsets_decreasing", f"{side} token ends decrease")
    if int(arr[-1]) != total:
        raise TilingError("offsets_not_covering", f"{side} tokens end at byte {int(arr[-1])}, text has {total}")
    return arr


def _as_int_array(values: object, what: str, ndim: int = 1) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros((0,) if ndim == 1 else (0, 2), dtype=np.int64)
    if arr.ndim != ndim or (ndim == 2 and arr.shape[1] != 2) or arr.dtype.kind not in "iu":
        raise TilingError("offsets_malformed", f"{what}: expected {ndim}-d integers, got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64, copy=False)
