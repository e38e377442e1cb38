"""The per-segment ratio inside F-TIS (training/segments.py, the ``segments`` argument of ftis_loss) and the
text-ratio baselines: identity with today's per-token loss, the worked example, shared segment weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from swarm_node.training.align import align, ends_from_lengths
from swarm_node.training.ftis import VARIANTS, ftis_loss
from swarm_node.training.segments import (
    TEXT_RATIOS,
    behaviour_layout,
    hacpo_ratio,
    per_byte_ratio,
    ratio_one,
    segment_log_ratios,
    segment_weights,
    text_ratio_weights,
)

DIAG_FIELDS = ("ratio_mean", "truncated_frac", "divergence", "kept", "filtered", "advantages", "n_tokens", "clipped_frac")


def _run(logp, logq, mask, adv, **kw):
    lp = logp.clone().requires_grad_()
    loss, diag = ftis_loss(lp, logq, mask, adv, **kw)
    loss.backward()
    return loss.detach(), lp.grad, diag


def _identity_rows(dtype, seed):
    """Rows built the way the text path builds them, from a tokenisation aligned with itself: random token
    byte lengths (a stop on most rows), segments and behaviour from align/segments. (A zero-width token mid-text
    joins the next segment, also against itself: the learner has none, its only zero-width token is the eos.)"""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(5):
        lens = [int(x) for x in rng.integers(1, 5, size=int(rng.integers(0, 12)))]
        lens += [0] if rng.random() < 0.7 or not lens else []
        al = align(sum(lens), ends_from_lengths(lens), ends_from_lengths(lens))
        assert al.is_identity
        lq = rng.normal(-1.5, 1.5, size=len(lens))
        rows.append((al.learner_segments(), behaviour_layout(al, lq), lq))
    t = max(len(r[0]) for r in rows)
    seg = torch.zeros((5, t), dtype=torch.int64)
    beh, lq_tok = torch.zeros((5, t)), torch.zeros((5, t))
    mask = torch.zeros((5, t), dtype=torch.bool)
    for i, (s, b, q) in enumerate(rows):
        n = len(s)
        seg[i, :n], beh[i, :n], lq_tok[i, :n], mask[i, :n] = torch.from_numpy(s), torch.from_numpy(b), torch.from_numpy(q), True
    logp = torch.from_numpy(rng.normal(-1.5, 1.5, size=(5, t))).to(dtype)
    adv = torch.from_numpy(rng.normal(size=5)).to(torch.float32)
    return logp, beh, lq_tok, mask, adv, seg


@pytest.mark.parametrize("old", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("variant", VARIANTS)
def test_same_tokenizer_segments_give_todays_loss_and_gradients_exactly(variant, dtype, old):
    """One token per segment: torch.equal (0 tolerance) on the loss, every gradient and every diagnostic."""
    for seed in range(6):
        logp, beh, lq_tok, mask, adv, seg = _identity_rows(dtype, seed)
        assert torch.equal(beh, lq_tok)  # the layout of identity segments is the generator's log-probs
        old_logp = (logp + 0.05 * torch.randn(logp.shape, dtype=dtype)) if old else None
        kw = dict(variant=variant, filter_threshold=0.3, old_logp=old_logp)
        ref = _run(logp, lq_tok, mask, adv, **kw)
        got = _run(logp, beh, mask, adv, segments=seg, **kw)
        assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
        for f in DIAG_FIELDS:
            assert torch.equal(getattr(ref[2], f), getattr(got[2], f)), f
        assert torch.equal(got[2].n_segments, got[2].n_tokens) and ref[2].n_segments is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_positional_identity_on_any_mask(variant):
    """segments[i, t] = t gives exactly segments=None also on masks with holes (padding anywhere)."""
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        logp, logq = torch.randn(4, 9, generator=g) - 1, torch.randn(4, 9, generator=g) - 1
        mask, adv = torch.rand(4, 9, generator=g) < 0.7, torch.randn(4, generator=g)
        ref = _run(logp, logq, mask, adv, variant=variant, filter_threshold=0.3)
        got = _run(logp, logq, mask, adv, variant=variant, filter_threshold=0.3, segments=torch.arange(9).repeat(4, 1))
        assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


# the design's worked example: y = 'abcd' + stop; generator 'ab','cd',<stop>; learner 'a','bc','d',<eos>
GEN_LENS, GEN_LQ, LEARNER_LENS, LEARNER_LP = [2, 2, 0], [-0.5, -1.0, -0.1], [1, 2, 1, 0], [-0.2, -0.9, -0.1, -0.4]


def _worked():
    al = align(4, ends_from_lengths(GEN_LENS), ends_from_lengths(LEARNER_LENS))
    seg = torch.from_numpy(al.learner_segments())[None]
    beh = torch.from_numpy(behaviour_layout(al, GEN_LQ)).to(torch.float32)[None]
    return al, seg, beh


def test_worked_example_numbers():
    al, seg, beh = _worked()
    delta = segment_log_ratios(torch.tensor(LEARNER_LP, dtype=torch.float64), GEN_LQ, al)
    torch.testing.assert_close(delta, torch.tensor([0.3, -0.3], dtype=torch.float64), rtol=0, atol=1e-12)
    logp = torch.tensor([LEARNER_LP])
    mask, adv = torch.ones((1, 4), dtype=torch.bool), torch.tensor([1.0])
    loss, grad, diag = _run(logp, beh, mask, adv, variant="ftis", segments=seg)
    rho = [math.exp(0.3), math.exp(-0.3)]  # both under C = 2
    assert rho[0] == pytest.approx(1.35, abs=1e-3)
    assert loss.item() == pytest.approx(-(rho[0] * (-1.2) + rho[1] * (-0.4)) / 4, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-rho[0] / 4] * 3 + [-rho[1] / 4]]), rtol=1e-6, atol=0)
    k3 = [math.exp(-d) + d - 1 for d in (0.3, -0.3)]
    assert diag.divergence.item() == pytest.approx(sum(k3) / 2, rel=1e-5)  # a mean over 2 segments, not 4 tokens
    assert diag.ratio_mean.item() == pytest.approx(sum(rho) / 2, rel=1e-6)
    assert diag.n_segments.tolist() == [2] and diag.n_tokens.tolist() == [4]


def test_segment_weight_is_shared_by_every_learner_token_and_truncated_per_segment():
    """Generator 'ab','cde','f' against learner 'abc','de','f': segment 'abcde' merges two tokens on each
    side. Its two learner tokens get one gradient weight, although their per-token ratios would differ."""
    al = align(6, ends_from_lengths([2, 3, 1]), ends_from_lengths([3, 2, 1]))
    assert al.gen_bounds.tolist() == [0, 2, 3] and al.learner_bounds.tolist() == [0, 2, 3]
    lq = [-2.0, -0.5, -1.0]
    lp = [-0.2, -1.0, -1.4]
    seg = torch.from_numpy(al.learner_segments())[None]
    beh = torch.from_numpy(behaviour_layout(al, lq)).to(torch.float32)[None]
    mask, adv = torch.ones((1, 3), dtype=torch.bool), torch.tensor([0.7])
    loss, grad, diag = _run(torch.tensor([lp]), beh, mask, adv, variant="tis", segments=seg)
    delta = [(-0.2 - 1.0) - (-2.0 - 0.5), -1.4 - (-1.0)]  # 1.3 (ratio 3.67, over C = 2) and -0.4
    rho = [min(math.exp(d), 2.0) for d in delta]
    want = [-rho[0] * 0.7 / 3, -rho[0] * 0.7 / 3, -rho[1] * 0.7 / 3]
    torch.testing.assert_close(grad, torch.tensor([want]), rtol=1e-6, atol=0)
    assert grad[0, 0] == grad[0, 1]
    assert diag.truncated_frac.item() == pytest.approx(0.5)  # one segment of two is over C
    # without the segments the same layout gives every token its own (different) weight
    _, grad_tok, _ = _run(torch.tensor([lp]), beh, mask, adv, variant="tis")
    assert grad_tok[0, 0] != grad_tok[0, 1]


def test_vis_counts_each_segment_surrogate_once():
    """vis with segments: r_k = exp(delta_k) carries the gradient, and each token's gradient is r_k A (the
    segment's term once, as F-TIS's rho_k A), not |k| r_k A."""
    al = align(6, ends_from_lengths([2, 3, 1]), ends_from_lengths([3, 2, 1]))
    lq, lp = [-1.0, -0.5, -1.0], [-0.6, -0.8, -1.05]  # delta = 0.1 and -0.05: both inside the clip range
    seg = torch.from_numpy(al.learner_segments())[None]
    beh = torch.from_numpy(behaviour_layout(al, lq)).to(torch.float32)[None]
    _, grad, _ = _run(torch.tensor([lp]), beh, torch.ones((1, 3), dtype=torch.bool), torch.tensor([1.0]),
                      variant="vis", segments=seg)
    r = [math.exp(0.1), math.exp(-0.05)]
    torch.testing.assert_close(grad, torch.tensor([[-r[0] / 3, -r[0] / 3, -r[1] / 3]]), rtol=1e-5, atol=0)


def test_filter_acts_on_the_segment_divergence():
    """A negative-advantage row whose segment log-ratios are small is kept, although its layout, read per
    token (segment sum on one token), looks far off-policy and would be filtered."""
    al = align(4, ends_from_lengths([4]), ends_from_lengths([1, 1, 1, 1]))
    seg = torch.from_numpy(al.learner_segments())[None]
    beh = torch.from_numpy(behaviour_layout(al, [-4.1])).to(torch.float32)[None]
    lp, mask, adv = torch.tensor([[-1.0, -1.0, -1.0, -1.0]]), torch.ones((1, 4), dtype=torch.bool), torch.tensor([-1.0])
    _, _, diag = _run(lp, beh, mask, adv, variant="ftis", filter_threshold=0.5, segments=seg)
    assert diag.kept.tolist() == [True] and diag.divergence.item() < 0.01
    _, _, diag_tok = _run(lp, beh, mask, adv, variant="ftis", filter_threshold=0.5)
    assert diag_tok.filtered.tolist() == [True]


def test_segment_log_ratios_are_differentiable_sums():
    al = align(6, ends_from_lengths([2, 3, 1]), ends_from_lengths([3, 2, 1]))
    lp = torch.tensor([-0.2, -1.0, -1.4], dtype=torch.float64, requires_grad=True)
    delta = segment_log_ratios(lp, np.array([-2.0, -0.5, -1.0]), al)
    (delta * torch.tensor([1.0, 10.0], dtype=torch.float64)).sum().backward()
    assert lp.grad.tolist() == [1.0, 1.0, 10.0]


def test_baselines_by_hand():
    lp = torch.tensor([-1.0, -2.0])
    lq = [-0.5, -0.5, -1.0]
    assert hacpo_ratio(lp, lq).item() == pytest.approx(math.exp(-1.5 + 2.0 / 3))
    assert hacpo_ratio(torch.tensor([-0.1]), lq).item() == 1.0  # clipped at 1
    # per byte: (sum lp - sum lq) / (bytes + stop) = (-3 + 2) / (3 + 1)
    assert per_byte_ratio(lp, lq, n_bytes=3, finished=True, cap=2.0).item() == pytest.approx(math.exp(-0.25))
    assert per_byte_ratio(lp * 0, lq, n_bytes=1, finished=False, cap=2.0).item() == 2.0  # exp(2) capped
    assert ratio_one(3).tolist() == [1.0, 1.0, 1.0]
    assert segment_weights(torch.tensor([0.0, 5.0]), cap=2.0).tolist() == [1.0, 2.0]


def test_text_ratio_weights_give_every_learner_token_its_arms_weight():
    al, _, _ = _worked()
    lp = torch.tensor(LEARNER_LP)
    filters = {}
    for kind in TEXT_RATIOS:
        w, filters[kind] = text_ratio_weights(kind, lp, GEN_LQ, al, cap=2.0)
        assert w.shape == (4,)
    w, _ = text_ratio_weights("segment", lp, GEN_LQ, al, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([math.exp(0.3)] * 3 + [math.exp(-0.3)], dtype=torch.float64))
    w, _ = text_ratio_weights("byte", lp, GEN_LQ, al, cap=2.0)  # (-1.6 + 1.6) / 5 bytes: ratio 1
    torch.testing.assert_close(w, torch.ones(4, dtype=torch.float64))
    w, _ = text_ratio_weights("hacpo", lp, GEN_LQ, al, cap=2.0)
    torch.testing.assert_close(w, torch.full((4,), min(math.exp(-1.6 / 4 + 1.6 / 3), 1.0), dtype=torch.float64))
    assert filters == {"segment": True, "segment_nofilter": False, "one": False, "hacpo": False, "byte": False}
    with pytest.raises(ValueError, match="unknown text ratio"):
        text_ratio_weights("nope", lp, GEN_LQ, al, cap=2.0)


def test_a_segment_map_that_does_not_fit_is_refused():
    logp, mask, adv = torch.zeros((1, 3)), torch.ones((1, 3), dtype=torch.bool), torch.ones(1)
    for bad in (torch.tensor([[0, 1, 3]]), torch.tensor([[0, -1, 1]]), torch.zeros((1, 3), dtype=torch.int32),
                torch.zeros((1, 2), dtype=torch.int64)):
        with pytest.raises(ValueError, match="segment"):
            ftis_loss(logp, logp, mask, adv, variant="ftis", segments=bad)
    # padding may hold anything
    ftis_loss(logp, logp, torch.tensor([[True, True, False]]), adv, variant="ftis", segments=torch.tensor([[0, 1, 99]]))
