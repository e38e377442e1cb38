"""F-TIS loss: values and gradients against hand computation, the filter rule, the PPO clip."""

from __future__ import annotations

import math

import pytest
import torch

from swarm_node.training.ftis import VARIANTS, ftis_loss, group_advantages

# two completions: 3 tokens and 2 tokens (last column of row 1 is padding, garbage values on purpose)
LOGP = [[-1.0, -2.0, -0.5], [-0.3, -1.5, 7.0]]
LOGQ = [[-1.2, -1.0, -0.5], [-0.3, -3.0, float("nan")]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -0.5]


def _tensors(logp=LOGP, logq=LOGQ, mask=MASK, adv=ADV, grad=False):
    lp = torch.tensor(logp, dtype=torch.float32, requires_grad=grad)
    return lp, torch.tensor(logq), torch.tensor(mask), torch.tensor(adv)


def _reference(variant, logp, logq, mask, adv, cap=2.0, g=50.0, eps=0.2):
    """Scalar loop version of the formulas in DESIGN.md; returns (loss, d loss / d logp, kept).

    vis/fvis (the paper's VIS): per token min(r A, clip(r, 1-eps, 1+eps) A) with r = pi/q carrying the
    gradient, so d/d logp = r A where the unclipped term is the smaller one, else 0.
    """
    weight = {"on_policy": "ratio", "is": "ratio", "tis": "cap", "ftis": "cap", "vis": "ppo",
              "fvis": "ppo"}.get(variant, "one")
    use_filter = variant in ("filter", "ftis", "fvis")
    terms, grads, kept = [], [], []
    for lp, lq, m, a in zip(logp, logq, mask, adv, strict=True):
        idx = [t for t, v in enumerate(m) if v]
        k = sum(math.exp(lq[t] - lp[t]) - (lq[t] - lp[t]) - 1 for t in idx) / len(idx)
        keep = not (use_filter and a < 0 and k > g)
        kept.append(keep)
        value, slope = {}, {}
        for t in idx:
            r = math.exp(lp[t] - lq[t])
            if weight == "ppo":
                clipped = min(max(r, 1 - eps), 1 + eps) * a
                value[t] = min(r * a, clipped)
                slope[t] = r * a if r * a <= clipped else 0.0
                continue
            rho = 1.0 if weight == "one" else (min(r, cap) if weight == "cap" else r)
            value[t], slope[t] = rho * a * lp[t], rho * a
        terms.append(sum(value[t] for t in idx) / len(idx) if keep else None)
        grads.append([(-slope[t] / len(idx)) if (keep and t in slope) else 0.0 for t in range(len(lp))])
    n = sum(kept)
    loss = -sum(x for x in terms if x is not None) / n
    return loss, [[x / n for x in row] for row in grads], kept


@pytest.mark.parametrize("variant", VARIANTS)
def test_values_and_gradients_match_hand_computation(variant):
    lp, lq, m, a = _tensors(grad=True)
    loss, diag = ftis_loss(lp, lq, m, a, variant=variant)
    ref_loss, ref_grad, ref_kept = _reference(variant, LOGP, LOGQ, MASK, ADV)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor(ref_grad), rtol=1e-5, atol=1e-7)
    assert diag.kept.tolist() == ref_kept


def test_naive_value_by_hand():
    # rho = 1: -(1/2) [ (1/3)(1)(-3.5) + (1/2)(-0.5)(-1.8) ] = -(1/2)(-1.1666667 + 0.45)
    lp, lq, m, a = _tensors()
    loss, _ = ftis_loss(lp, lq, m, a, variant="naive")
    assert loss.item() == pytest.approx(0.5 * (3.5 / 3 - 0.45), rel=1e-6)


def test_tis_caps_ratio_and_reports_truncation():
    lp, lq, m, a = _tensors()
    _, diag = ftis_loss(lp, lq, m, a, variant="tis")
    # row 1 token 1: ratio exp(1.5) = 4.48 > 2 -> one of two tokens truncated
    assert diag.truncated_frac.tolist() == pytest.approx([0.0, 0.5])
    assert diag.ratio_mean[1].item() == pytest.approx((1 + math.exp(1.5)) / 2, rel=1e-5)
    # divergence is the mean over valid tokens only (row 1: two tokens, not three)
    d = [0.0, -1.5]
    k1 = sum(math.exp(x) - x - 1 for x in d) / 2
    assert diag.divergence[1].item() == pytest.approx(k1, rel=1e-5)


def test_filter_drops_negative_advantage_only():
    # both sequences equally far from the behaviour policy (k ~ 1.9e4 > 50); only A < 0 is dropped
    logp = [[-10.0, -10.0], [-10.0, -10.0]]
    logq = [[-0.1, -0.1], [-0.1, -0.1]]
    mask = [[1, 1], [1, 1]]
    lp, lq, m, _ = _tensors(logp, logq, mask)
    for variant in ("filter", "ftis"):
        loss, diag = ftis_loss(lp, lq, m, torch.tensor([1.0, -1.0]), variant=variant)
        assert diag.kept.tolist() == [True, False]
        assert diag.filtered.tolist() == [False, True]
        assert diag.divergence[0].item() > 50
        loss2, diag2 = ftis_loss(lp, lq, m, torch.tensor([-1.0, 1.0]), variant=variant)
        assert diag2.kept.tolist() == [False, True]
    # below the threshold nothing is filtered
    _, diag = ftis_loss(lp, lq, m, torch.tensor([1.0, -1.0]), variant="ftis", filter_threshold=1e5)
    assert diag.kept.tolist() == [True, True]
    # variants without the filter keep everything
    for variant in ("naive", "is", "tis", "on_policy"):
        _, diag = ftis_loss(lp, lq, m, torch.tensor([1.0, -1.0]), variant=variant)
        assert diag.kept.tolist() == [True, True]


def test_filtered_sequences_still_count_in_group_statistics():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    adv = group_advantages(rewards, eps=1e-6)
    mean, std = 0.4, math.sqrt(sum((r - 0.4) ** 2 for r in [1, 0, 0, 1, 0]) / 4)  # unbiased std
    assert adv.tolist() == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards.tolist()], rel=1e-5)
    # sequence 4 (A < 0) is far off-policy and gets filtered; the others keep the full-group advantages
    logp = torch.full((5, 2), -1.0, requires_grad=True)
    logq = torch.full((5, 2), -1.0)
    logq[4] = 0.0
    loss, diag = ftis_loss(logp, logq, torch.ones(5, 2), adv, variant="ftis", filter_threshold=0.5)
    assert diag.kept.tolist() == [True, True, True, True, False]
    assert diag.advantages.tolist() == pytest.approx(adv.tolist())
    expected = -sum(adv[i].item() * -1.0 for i in range(4)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # recomputing advantages without the filtered member would give another (wrong) value
    adv_wrong = group_advantages(rewards[:4])
    assert -sum(adv_wrong[i].item() * -1.0 for i in range(4)) / 4 != pytest.approx(expected)


def test_group_advantages_zero_when_rewards_equal():
    assert group_advantages(torch.full((4,), 0.7)).tolist() == [0.0] * 4
    assert group_advantages(torch.tensor([1.0])).tolist() == [0.0]


def test_ftis_equals_on_policy_when_behaviour_is_current():
    torch.manual_seed(0)
    base = -torch.rand(4, 5) * 3
    mask = torch.ones(4, 5)
    mask[2, 3:] = 0
    adv = torch.tensor([1.2, -0.7, 0.3, -0.8])
    out = {}
    for variant in ("ftis", "on_policy"):
        lp = base.clone().requires_grad_(True)
        loss, diag = ftis_loss(lp, base.clone(), mask, adv, variant=variant)
        loss.backward()
        out[variant] = (loss.detach(), lp.grad.clone())
        assert diag.mean_ratio == pytest.approx(1.0)
        assert diag.n_kept == 4
    torch.testing.assert_close(out["ftis"][0], out["on_policy"][0])
    torch.testing.assert_close(out["ftis"][1], out["on_policy"][1])


def test_ppo_clip():
    lq = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    old = torch.tensor([[-1.5, -1.0]])  # token 0: r = exp(0.5) = 1.65 > 1.2; token 1: r = 1
    for adv, grad0_zero in ((1.0, True), (-1.0, False)):
        lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
        loss, diag = ftis_loss(lp, lq, mask, torch.tensor([adv]), variant="tis", old_logp=old)
        loss.backward()
        rho0 = min(math.exp(-1.5 + 1.0), 2.0)  # truncated weight from the proximal (old) policy
        if grad0_zero:  # positive advantage, ratio above 1 + eps: clipped, no gradient
            assert lp.grad[0, 0].item() == 0.0
            assert diag.clipped_frac.item() == pytest.approx(0.5)
        else:  # negative advantage: the unclipped (more pessimistic) term is active
            assert lp.grad[0, 0].item() == pytest.approx(-rho0 * math.exp(0.5) * adv / 2, rel=1e-5)
        assert lp.grad[0, 1].item() == pytest.approx(-1.0 * adv / 2, rel=1e-5)


def test_ppo_form_matches_plain_gradient_at_ratio_one():
    torch.manual_seed(1)
    base = -torch.rand(3, 4) * 2
    lq = base - 0.3 * torch.rand(3, 4)
    adv = torch.tensor([0.5, -1.0, 1.5])
    grads = []
    for old in (None, base.clone()):
        lp = base.clone().requires_grad_(True)
        loss, _ = ftis_loss(lp, lq, torch.ones(3, 4), adv, variant="ftis", old_logp=old)
        loss.backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_everything_filtered_gives_zero_loss_and_gradient():
    lp = torch.full((1, 2), -10.0, requires_grad=True)
    loss, diag = ftis_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([-1.0]), variant="ftis")
    loss.backward()
    assert diag.n_kept == 0 and loss.item() == 0.0
    assert torch.all(lp.grad == 0)


def test_unknown_variant():
    lp, lq, m, a = _tensors()
    with pytest.raises(ValueError, match="unknown variant"):
        ftis_loss(lp, lq, m, a, variant="grpo")


def test_vis_is_the_ppo_clip_against_the_generator():
    """Row 0 (A > 0): the token with r = e^0.2 > 1.2 is clipped (no gradient); r = e^-1 and r = 1 pass.
    Row 1 (A < 0): r = e^1.5 is far above 1 + eps but the unclipped term is the smaller one: full gradient r A."""
    lp, lq, m, a = _tensors(grad=True)
    loss, diag = ftis_loss(lp, lq, m, a, variant="vis")
    loss.backward()
    g = lp.grad
    assert g[0, 0].item() == 0.0 and g[0, 1].item() == pytest.approx(-math.exp(-1.0) / 3 / 2, rel=1e-5)
    assert g[1, 1].item() == pytest.approx(0.5 * math.exp(1.5) / 2 / 2, rel=1e-5)
    assert diag.clipped_frac[0].item() == pytest.approx(1 / 3)
    # the same batch under the project's uncapped `is` weighs the clipped token instead
    lp2, lq2, m2, a2 = _tensors(grad=True)
    ftis_loss(lp2, lq2, m2, a2, variant="is")[0].backward()
    assert lp2.grad[0, 0].item() != 0.0


def test_filter_sign_is_a_choice():
    """A zero-advantage sequence far off-policy: kept under A < 0, dropped under the paper code's A <= 0."""
    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    lq = torch.tensor([[-60.0, -60.0], [-1.0, -1.0]])  # row 0: divergence ~ 58 > g = 50
    m = torch.ones(2, 2)
    adv = torch.tensor([0.0, 1.0])
    _, strict = ftis_loss(lp, lq, m, adv, variant="ftis")
    _, paper_code = ftis_loss(lp, lq, m, adv, variant="ftis", filter_non_positive=True)
    assert strict.kept.tolist() == [True, True] and paper_code.kept.tolist() == [False, True]
