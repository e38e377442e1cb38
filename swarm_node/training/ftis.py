"""F-TIS / GRPO loss as pure tensor code (no models, no networking), so every variant is testable by hand.

All six comparison variants go through one code path; they differ only in the per-token weight rho_t and
in whether the negative-advantage divergence filter is on. See docs/algorithms.md for the formulas and
for how the normalization differs from the paper's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor

from swarm_node.config import Variant
from swarm_node.training.segments import segment_sum, spread

VARIANTS: tuple[str, ...] = get_args(Variant)

# variant -> (weight kind, filter on). "ratio": exp(logp - logq) uncapped; "capped": min(ratio, C); "one": 1;
# "ppo": no separate weight, the PPO clipped surrogate with the generator as the old policy (the paper's VIS).
_VARIANT_SPEC: dict[str, tuple[str, bool]] = {
    "on_policy": ("ratio", False),
    "naive": ("one", False),
    "is": ("ratio", False),
    "tis": ("capped", False),
    "filter": ("one", True),
    "ftis": ("capped", True),
    "vis": ("ppo", False),
    "fvis": ("ppo", True),
}


def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """A_i = (r_i - mean r) / (std r + eps) with the *unbiased* std (torch.std, as the paper's code).

    A group whose rewards are all equal, or that has a single member (unbiased std undefined), gets
    exactly zero advantages: it carries no learning signal and the trainer may skip it.
    """
    r = rewards.detach().to(torch.float64).flatten()
    if r.numel() < 2 or bool(r.max() == r.min()):
        return torch.zeros_like(rewards, dtype=torch.float32)
    adv = (r - r.mean()) / (r.std(unbiased=True) + eps)
    return adv.to(torch.float32).reshape(rewards.shape)


@dataclass
class LossDiagnostics:
    """Per-sequence quantities of one loss call (all detached, shape [B]) and batch aggregates.

    ratio_mean and truncated_frac describe exp(logp - logq) whatever the variant (naive and filter do not
    use the ratio, but it still tells how off-policy the data is). ``kept`` is False for filtered and for
    empty (no completion token) sequences. With segments, ratio_mean, truncated_frac and divergence are
    over segments, and ``n_segments`` counts them per sequence (None without segments).
    """

    ratio_mean: Tensor
    truncated_frac: Tensor
    divergence: Tensor
    kept: Tensor
    filtered: Tensor
    advantages: Tensor
    n_tokens: Tensor
    clipped_frac: Tensor
    n_segments: Tensor | None = None

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())

    @property
    def n_filtered(self) -> int:
        return int(self.filtered.sum())

    @property
    def tokens(self) -> int:
        return int(self.n_tokens.sum())

    def token_mean(self, per_seq: Tensor, select: Tensor | None = None) -> float:
        """Token-weighted mean of a per-sequence mean (e.g. the batch ratio), over ``select`` rows."""
        w = self.n_tokens.to(torch.float64)
        if select is not None:
            w = w * select.to(torch.float64)
        total = float(w.sum())
        return float((per_seq.to(torch.float64) * w).sum()) / total if total > 0 else float("nan")

    @property
    def mean_ratio(self) -> float:
        return self.token_mean(self.ratio_mean)


def ftis_loss(
    logp: Tensor,
    behaviour_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    *,
    variant: str,
    cap: float = 2.0,
    filter_threshold: float = 50.0,
    clip_eps: float = 0.2,
    old_logp: Tensor | None = None,
    normalizer: float | None = None,
    filter_non_positive: bool = False,
    segments: Tensor | None = None,
) -> tuple[Tensor, LossDiagnostics]:
    """GRPO-family loss over a batch of completions; returns (scalar loss, diagnostics).

    Shapes: logp, behaviour_logp, mask, old_logp [B, T]; advantages [B]. ``mask`` is 1 on completion
    tokens; values elsewhere are ignored (may even be non-finite). ``logp`` carries the gradient.

    Without ``old_logp`` (one optimizer step per batch):
        loss = -(1/N) sum_{i kept} (1/|a_i|) sum_t rho_t A_i logp_t
    with rho_t detached and N = ``normalizer`` (default: the number of kept sequences, i.e. the paper
    code's mean over the sequences left after filtering). The trainer passes 1.0 (a sum) per
    micro-batch and divides the accumulated gradient by the global kept count.

    With ``old_logp`` (several steps on one batch), the per-token term becomes the PPO surrogate
    rho_t * min(r_t A_i, clip(r_t, 1-eps, 1+eps) A_i) with r_t = exp(logp_t - old_logp_t), and rho_t and
    the divergence are taken from ``old_logp`` (decoupled PPO: behaviour -> proximal weight, proximal ->
    current clipped ratio), so the weight and the kept set stay fixed over the steps on one batch.

    ``vis`` / ``fvis`` (the paper's VIS baseline) use no separate weight: the per-token term is
    min(r_t A_i, clip(r_t, 1-eps, 1+eps) A_i) with r_t = exp(logp_t - logq_t) carrying the gradient, i.e. the
    generator is PPO's old policy, whatever ``old_logp`` says.

    The filter drops sequences with A_i < 0 (the paper's text), or A_i <= 0 with ``filter_non_positive``
    (the paper's code). Zero-advantage sequences carry no gradient, but a dropped one no longer counts in
    the default normalizer.

    ``segments`` [B, T] (int64, values in [0, T) on completion tokens) maps each token to a segment column of
    its row: completions from another tokenizer (training/align.py, training/segments.py). Then
    ``behaviour_logp`` holds each segment's generator log-prob sum on one of its tokens and 0 on the others
    (segments.behaviour_layout); the log-ratio, truncation, divergence (mean over segments) and filter are
    per segment, and every token of a segment takes its segment's weight rho_k; the 1/|a_i| stays per
    token. vis/fvis take r = exp(delta_k) per segment too, its surrogate counted once per segment (each token
    carries 1/|k| of it); with ``old_logp`` (learner against its own earlier
    log-probs) r stays per token. ``segments[i, t] = t`` (every token its own segment) gives exactly the
    result of ``segments=None``.
    """
    if variant not in _VARIANT_SPEC:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    weight_kind, use_filter = _VARIANT_SPEC[variant]
    valid = mask.bool()
    adv = advantages.detach().to(torch.float32)
    ref = (old_logp if old_logp is not None else logp).detach().to(torch.float32)
    logq = behaviour_logp.detach().to(torch.float32)

    # log ratio of the reference (current or proximal) policy to the behaviour policy, 0 off-mask.
    log_ratio = torch.where(valid, ref - logq, torch.zeros_like(ref))
    n_tok = valid.sum(dim=1)
    denom = n_tok.clamp(min=1).to(torch.float64)
    # the units the ratio is taken over: tokens, or segments (a segment's column holds its summed log-ratio)
    seg = None if segments is None else _checked_segments(segments, valid)
    unit_lr, unit_valid, unit_denom, n_seg, seg_size = log_ratio, valid, denom, None, None
    if seg is not None:
        unit_lr = segment_sum(log_ratio, seg)
        seg_size = segment_sum(valid.to(torch.int64), seg)
        unit_valid = seg_size > 0
        n_seg = unit_valid.sum(dim=1)
        unit_denom = n_seg.clamp(min=1).to(torch.float64)
    lr64 = unit_lr.to(torch.float64)
    ratio64 = torch.where(unit_valid, lr64.exp(), torch.zeros_like(lr64))
    # k3 estimator of KL(pi_theta || pi_gen) per token (segment), averaged over valid tokens (segments) only.
    k_tok = torch.where(unit_valid, (-lr64).exp() + lr64 - 1.0, torch.zeros_like(lr64))
    divergence = k_tok.sum(dim=1) / unit_denom
    truncated = (unit_valid & (ratio64 > cap)).sum(dim=1).to(torch.float64) / unit_denom

    nonempty = n_tok > 0
    negative = adv <= 0 if filter_non_positive else adv < 0
    filtered = (
        nonempty & negative & (divergence > filter_threshold) if use_filter else torch.zeros_like(nonempty)
    )
    kept = nonempty & ~filtered

    if weight_kind in ("one", "ppo"):
        rho = torch.ones_like(log_ratio)
    else:
        rho = unit_lr.exp()
        if weight_kind == "capped":
            rho = rho.clamp(max=cap)
        if seg is not None:
            rho = torch.where(valid, spread(rho, seg), torch.ones_like(rho))

    lp = torch.where(valid, logp.to(torch.float32), torch.zeros_like(ref))
    a = adv[:, None]
    if weight_kind == "ppo" or old_logp is not None:
        old = logq if weight_kind == "ppo" else ref
        log_r = lp - torch.where(valid, old, torch.zeros_like(old))
        if seg is not None and weight_kind == "ppo":
            log_r = torch.where(valid, spread(segment_sum(log_r, seg), seg), torch.zeros_like(log_r))
        r = log_r.exp()
        unclipped = r * a
        clipped_term = r.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a
        surrogate = torch.minimum(unclipped, clipped_term)
        if seg_size is not None and weight_kind == "ppo":
            # one surrogate per segment, shared by its tokens: each token's gradient is r_k A, as F-TIS's rho_k A
            surrogate = surrogate / spread(seg_size, seg).clamp(min=1).to(surrogate.dtype)
        clipped = valid & (clipped_term.detach() < unclipped.detach())
    else:
        surrogate = lp * a
        clipped = torch.zeros_like(valid)
    per_tok = torch.where(valid, rho * surrogate, torch.zeros_like(surrogate))
    per_seq = per_tok.sum(dim=1) / denom.to(per_tok.dtype)
    per_seq = torch.where(kept, per_seq, torch.zeros_like(per_seq))
    n = float(normalizer) if normalizer is not None else max(int(kept.sum()), 1)
    loss = -per_seq.sum() / n

    diag = LossDiagnostics(
        ratio_mean=(ratio64.sum(dim=1) / unit_denom).to(torch.float32),
        truncated_frac=truncated.to(torch.float32),
        divergence=divergence.to(torch.float32),
        kept=kept,
        filtered=filtered,
        advantages=adv,
        n_tokens=n_tok,
        clipped_frac=(clipped.sum(dim=1).to(torch.float64) / denom).to(torch.float32),
        n_segments=n_seg,
    )
    return loss, diag


def _checked_segments(segments: Tensor, valid: Tensor) -> Tensor:
    """The segment map with padding sent to column 0 (it adds 0.0 there); refuses a map that does not fit."""
    if segments.shape != valid.shape or segments.dtype != torch.int64:
        raise ValueError(f"segments must be int64 {tuple(valid.shape)}, got {segments.dtype} {tuple(segments.shape)}")
    seg = torch.where(valid, segments, torch.zeros_like(segments))
    if seg.numel() and (int(seg.min()) < 0 or int(seg.max()) >= seg.shape[1]):
        raise ValueError(f"segment index outside [0, {seg.shape[1]})")
    return seg
