"""Alignment on common byte boundaries (training/align.py) against a brute-force reference, on random texts
tokenised by four offline tokenizers: the tiny presets' character-level one, a byte-level BPE trained here,
a BPE with byte fallback (<0xNN> tokens, ends inside UTF-8 characters) and the stand-ins' 256-byte one."""

from __future__ import annotations

import functools
import json
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm_node.training.align import (
    TILING_REASONS,
    TilingError,
    align,
    ends_from_lengths,
    ends_from_spans,
)
from swarm_node.training.segments import behaviour_layout, segment_logq

ASCII = [chr(i) for i in range(32, 127)] + ["\n"]
UNICODE = ["é", "ß", "€", "中", "😀", "ñ", "Ω"]  # 2, 2, 3, 3, 4, 2, 2 bytes in UTF-8


def _corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = [f"{a}+{b}={a + b}" for a in range(40) for b in range(0, 40, 3)]
    words = ["the answer is", "café", "naïve", "Größe", "let me compute", "€ 12", "中文"]
    lines += [" ".join(rng.choice(words) for _ in range(4)) for _ in range(200)]
    return lines


class Pieces:
    """A tokenizer as the alignment sees it: text -> the byte piece of every token (None if the tokenizer
    cannot reproduce the text, e.g. the char tokenizer's <unk>)."""

    def __init__(self, name: str, tokenizer, to_bytes) -> None:
        self.name, self.tokenizer, self.to_bytes = name, tokenizer, to_bytes

    def __call__(self, text: str) -> list[bytes] | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        pieces = [self.to_bytes(self.tokenizer.id_to_token(i)) for i in ids]
        return pieces if b"".join(pieces) == text.encode() else None


@functools.cache
def tokenizer(kind: str) -> Pieces:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}

    def byte_level(tok: str) -> bytes:
        return bytes(byte_of[c] for c in tok)

    if kind == "char":
        from swarm_node.models.factory import build_tokenizer

        return Pieces(kind, build_tokenizer().backend_tokenizer, lambda t: t.encode())
    if kind == "bytes":
        from swarm_node.models.standins import byte_tokenizer

        return Pieces(kind, byte_tokenizer().backend_tokenizer, byte_level)
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400, min_frequency=2, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        tok.train_from_iterator(_corpus(), trainer)
        return Pieces(kind, tok, byte_level)
    assert kind == "fallback"
    base = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=2, show_progress=False, initial_alphabet=ASCII)
    # only 'é' beyond ASCII gets a token of its own: the other characters fall back to <0xNN> bytes
    base.train_from_iterator([t for t in _corpus(1) if all(c in ASCII or c == "é" for c in t)], trainer)
    model = json.loads(base.to_str())["model"]
    vocab = dict(model["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])

    def fallback(t: str) -> bytes:
        return bytes([int(t[3:5], 16)]) if len(t) == 6 and t.startswith("<0x") and t.endswith(">") else t.encode()

    return Pieces(kind, tok, fallback)


KINDS = ("char", "bpe", "fallback", "bytes")


def brute_force(n_bytes: int, gen_lens: list[int], learner_lens: list[int]) -> tuple[list[int], list[int], bool]:
    """The documented rules by enumeration: (segment of each generator token, of each learner token, end
    segment present). Raises TilingError('unmatched_end') like align."""

    def spans(lens: list[int]) -> list[tuple[int, int]]:
        out, pos = [], 0
        for w in lens:
            out.append((pos, pos + w))
            pos += w
        return out

    gs, ls = spans(gen_lens), spans(learner_lens)
    gen_cuts = {e for s, e in gs if e > s}
    learner_cuts = {e for s, e in ls if e > s}
    cuts = [0] + [b for b in range(1, n_bytes + 1) if (b in gen_cuts and b in learner_cuts) or b == n_bytes]
    k_content = len(cuts) - 1
    end_seg = any(s == e == n_bytes for s, e in gs) and any(s == e == n_bytes for s, e in ls)
    if k_content == 0 and not end_seg and (gs or ls):
        raise TilingError("unmatched_end", "brute force")

    def seg(s: int, e: int) -> int:
        if e > s:
            return next(k for k in range(k_content) if cuts[k] < e <= cuts[k + 1])
        if s == n_bytes:
            return k_content if end_seg else k_content - 1
        return next(k for k in range(k_content) if cuts[k] <= s < cuts[k + 1])

    return [seg(s, e) for s, e in gs], [seg(s, e) for s, e in ls], end_seg


def check_against_brute_force(text: bytes, gen: list[bytes], learner: list[bytes], lq: list[float]) -> None:
    n = len(text)
    g_lens, l_lens = [len(p) for p in gen], [len(p) for p in learner]
    try:
        ref_g, ref_l, ref_end = brute_force(n, g_lens, l_lens)
    except TilingError as e:
        with pytest.raises(TilingError) as got:
            align(n, ends_from_lengths(g_lens), ends_from_lengths(l_lens))
        assert got.value.reason == e.reason == "unmatched_end"
        return
    al = align(n, ends_from_lengths(g_lens), ends_from_lengths(l_lens))
    assert al.gen_segments().tolist() == ref_g
    assert al.learner_segments().tolist() == ref_l
    assert al.end_segment == ref_end
    # independent of the rules: each segment has tokens of both sides and the same text on both sides
    assert (np.diff(al.gen_bounds) >= 1).all() and (np.diff(al.learner_bounds) >= 1).all()
    for k in range(al.n_segments):
        g_text = b"".join(gen[al.gen_bounds[k] : al.gen_bounds[k + 1]])
        l_text = b"".join(learner[al.learner_bounds[k] : al.learner_bounds[k + 1]])
        assert g_text == l_text
        assert sum(len(p) for p in learner[: al.learner_bounds[k + 1]]) == al.byte_ends[k]
    want = [math.fsum(q for s, q in zip(ref_g, lq, strict=True) if s == k) for k in range(al.n_segments)]
    np.testing.assert_allclose(segment_logq(al, np.array(lq)), want, rtol=1e-12, atol=1e-12)
    if gen == learner:
        assert al.is_identity


texts = st.lists(st.sampled_from(ASCII + UNICODE), min_size=0, max_size=24).map("".join)


@pytest.mark.parametrize("learner_kind", KINDS)
@pytest.mark.parametrize("gen_kind", KINDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, data=st.data())
def test_alignment_matches_brute_force_on_random_texts(gen_kind, learner_kind, text, data):
    gen, learner = tokenizer(gen_kind)(text), tokenizer(learner_kind)(text)
    if "char" in (gen_kind, learner_kind) and any(c in UNICODE for c in text):
        assert (gen if gen_kind == "char" else learner) is None  # the char tokenizer cannot say it (<unk>)
        return
    assert gen is not None and learner is not None
    # special tokens of zero bytes: generator markers mid-text, and a stop/eos at the end on either side
    for _ in range(data.draw(st.integers(0, 2))):
        gen.insert(data.draw(st.integers(0, len(gen))), b"")
    ends = data.draw(st.sampled_from(["both", "both", "neither", "gen", "learner"]))
    gen += [b""] if ends in ("both", "gen") else []
    learner += [b""] if ends in ("both", "learner") else []
    lq = data.draw(st.lists(st.floats(-20, 0), min_size=len(gen), max_size=len(gen)))
    check_against_brute_force(text.encode(), gen, learner, lq)


def test_tokenizers_differ_and_split_characters():
    """The fixtures give what the test claims: different boundaries, and byte tokens inside a character."""
    text = "12+7=19 café €"
    pieces = {k: tokenizer(k)(text) for k in ("bpe", "fallback", "bytes")}
    assert len({tuple(p) for p in pieces.values()}) == 3
    assert tokenizer("char")(text) is None and tokenizer("char")("12+7=19") == [c.encode() for c in "12+7=19"]
    assert [b"\xe2", b"\x82", b"\xac"] == pieces["fallback"][-3:]  # '€' by byte fallback
    assert any(len(p) > 1 for p in pieces["bpe"])  # merges were learned
    # 'café €': BPE 'café',' €' against fallback 'café ',<E2>,<82>,<AC>: one segment of 2 and 4 tokens
    gen, learner = tokenizer("bpe")("café €"), tokenizer("fallback")("café €")
    al = align(9, ends_from_lengths([len(p) for p in gen]), ends_from_lengths([len(p) for p in learner]))
    assert (gen, learner) == ([b"caf\xc3\xa9", b" \xe2\x82\xac"], [b"caf\xc3\xa9 ", b"\xe2", b"\x82", b"\xac"])
    assert al.n_segments == 1 and al.learner_segments().tolist() == [0, 0, 0, 0]


def test_worked_example_of_the_design():
    """y = 'abcd' + stop: generator 'ab','cd',<stop>; learner 'a','bc','d',<eos> (design section 4)."""
    al = align(4, ends_from_lengths([2, 2, 0]), ends_from_lengths([1, 2, 1, 0]))
    assert al.learner_segments().tolist() == [0, 0, 0, 1]
    assert al.gen_segments().tolist() == [0, 0, 1]
    assert al.byte_ends.tolist() == [4, 4] and al.end_segment
    lq = [-0.5, -1.0, -0.1]
    np.testing.assert_allclose(segment_logq(al, lq), [-1.5, -0.1])
    np.testing.assert_allclose(behaviour_layout(al, lq), [0.0, 0.0, -1.5, -0.1])


def test_same_tokenisation_gives_one_token_per_segment():
    al = align(4, ends_from_lengths([2, 2, 0]), ends_from_lengths([2, 2, 0]))
    assert al.is_identity and al.learner_segments().tolist() == [0, 1, 2]
    lq = np.array([-0.5, -1.0, -0.1])
    assert np.array_equal(behaviour_layout(al, lq), lq)


@pytest.mark.parametrize(
    ("n", "gen", "learner", "n_segments", "end"),
    [
        (0, [], [], 0, False),  # empty and unfinished: nothing to train on
        (0, [0], [0], 1, True),  # empty, finished: only the end event
        (1, [1], [1], 1, False),  # one character
        (1, [1, 0], [1, 0], 2, True),  # one character and stop
        (2, [2, 0], [1, 1, 0], 2, True),  # 'é' as one token against its two bytes
        (2, [1, 1], [1, 1], 2, False),  # both split 'é' after its first byte: a boundary inside a character
    ],
)
def test_small_completions(n, gen, learner, n_segments, end):
    al = align(n, ends_from_lengths(gen), ends_from_lengths(learner))
    assert (al.n_segments, al.end_segment) == (n_segments, end)
    assert al.n_gen == len(gen) and al.n_learner == len(learner)


def test_boundary_inside_a_character_is_a_segment_boundary():
    text = "é".encode()
    al = align(len(text), ends_from_lengths([1, 1]), ends_from_lengths([1, 1]))
    assert al.byte_ends.tolist() == [1, 2]


def test_zero_width_tokens_join_the_following_bytes_or_the_last_segment():
    # generator: 'a', <mark>, 'b', <stop>; learner: 'a', 'b' (no eos): the mark joins 'b', the stop too
    al = align(2, ends_from_lengths([1, 0, 1, 0]), ends_from_lengths([1, 1]))
    assert al.gen_segments().tolist() == [0, 1, 1, 1] and not al.end_segment
    # a mark at offset 0 joins the first segment
    al = align(2, ends_from_lengths([0, 2]), ends_from_lengths([1, 1]))
    assert al.gen_segments().tolist() == [0, 0]


def test_empty_text_with_an_end_token_on_one_side_only_is_refused():
    with pytest.raises(TilingError) as e:
        align(0, ends_from_lengths([0]), ends_from_lengths([]))
    assert e.value.reason == "unmatched_end"


@pytest.mark.parametrize(
    ("n", "gen", "reason"),
    [
        (4, [2, 3], "offsets_not_covering"),  # ends short of the text
        (4, [2, 5], "offsets_not_covering"),  # past the text
        (4, [], "offsets_not_covering"),
        (4, [3, 2, 4], "offsets_decreasing"),
        (4, [-1, 4], "offsets_malformed"),
        (4, [[1, 2], [3, 4]], "offsets_malformed"),
        (4, [1.0, 4.0], "offsets_malformed"),
        (-1, [], "offsets_malformed"),
    ],
)
def test_offsets_that_do_not_tile_raise_a_countable_reason(n, gen, reason):
    with pytest.raises(TilingError) as e:
        align(n, gen, [4])
    assert e.value.reason == reason and e.value.reason in TILING_REASONS
    assert isinstance(e.value, ValueError)


def test_spans_must_follow_each_other():
    assert ends_from_spans([(0, 2), (2, 2), (2, 5)]).tolist() == [2, 2, 5]
    for bad in ([(0, 2), (3, 5)], [(0, 2), (1, 5)], [(1, 2)]):
        with pytest.raises(TilingError, match="offsets_not_covering"):
            ends_from_spans(bad)
    with pytest.raises(TilingError, match="offsets_malformed"):
        ends_from_lengths([2, -1])
