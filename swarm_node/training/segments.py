"""Per-segment log-ratios for completions from another tokenizer, and the text-ratio baselines.

A segment (training/align.py) is the text between two common byte boundaries of the generator's and the
learner's tokenisations. Its log-ratio is delta_k = sum of the learner's log-probs in it minus the sum of the
generator's (behaviour) log-probs in it; F-TIS truncates and filters on delta_k, and every learner token of
the segment takes the segment's weight (docs/algorithms.md "Segment ratio"). Same tokenizer: one token per
segment, delta_k is today's per-token log-ratio.

Two layers:
- per completion (numpy + autograd tensors): ``segment_logq``, ``behaviour_layout``, ``segment_log_ratios``,
  and the baselines (``ratio_one``, ``hacpo_ratio``, ``per_byte_ratio``, ``segment_weights``);
- per batch [B, T] (used by ftis_loss): ``segment_sum`` and ``spread``, a scatter-add and a gather that are
  exact (bit for bit) when every token is its own segment.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from swarm_node.training.align import Alignment

# text-ratio kinds -> whether F-TIS's divergence filter applies (see text_ratio_weights)
TEXT_RATIOS: dict[str, bool] = {"segment": True, "segment_nofilter": False, "one": False, "hacpo": False, "byte": False}


def segment_logq(alignment: Alignment, gen_logprobs: np.ndarray | Tensor) -> np.ndarray:
    """log q_k: the sum of the generator's behaviour log-probs over the generator tokens of each segment."""
    lq = _np64(gen_logprobs)
    if lq.shape != (alignment.n_gen,):
        raise ValueError(f"{lq.shape[0] if lq.ndim else 0} generator log-probs for {alignment.n_gen} tokens")
    return np.bincount(alignment.gen_segments(), weights=lq, minlength=alignment.n_segments)


def behaviour_layout(alignment: Alignment, gen_logprobs: np.ndarray | Tensor) -> np.ndarray:
    """The behaviour log-probs laid out on the learner's tokens, as ftis_loss's ``behaviour_logp`` with
    ``segments``: log q_k on the last learner token of segment k, 0 on its other tokens (so a segment's sum
    of learner minus behaviour values is delta_k). Same tokenisation: the generator's log-probs unchanged."""
    out = np.zeros(alignment.n_learner, dtype=np.float64)
    if alignment.n_segments:
        out[alignment.learner_bounds[1:] - 1] = segment_logq(alignment, gen_logprobs)
    return out


def segment_log_ratios(learner_logp: Tensor, gen_logprobs: np.ndarray | Tensor, alignment: Alignment) -> Tensor:
    """delta_k = sum_{learner j in k} logp_j - log q_k for every segment ([K], differentiable in learner_logp)."""
    if learner_logp.shape != (alignment.n_learner,):
        raise ValueError(f"{tuple(learner_logp.shape)} learner log-probs for {alignment.n_learner} tokens")
    seg = torch.from_numpy(alignment.learner_segments()).to(learner_logp.device)
    logp_k = torch.zeros(alignment.n_segments, dtype=learner_logp.dtype, device=learner_logp.device)
    logp_k = logp_k.index_add(0, seg, learner_logp)
    logq_k = torch.from_numpy(segment_logq(alignment, gen_logprobs)).to(logp_k)
    return logp_k - logq_k


def segment_weights(log_ratios: Tensor, cap: float) -> Tensor:
    """Segment F-TIS's weight rho_k = min(exp(delta_k), C) (detached). With the divergence filter on, this is
    the issue's correction; "segments without the filter" is the same weight with the filter off."""
    return log_ratios.detach().exp().clamp(max=cap)


def ratio_one(n_learner: int) -> Tensor:
    """Weight 1 on every token, no filter: gensyn's genrl/SAPO, which re-tokenises shared text and sets
    ``old_per_token_logps=None`` (the importance ratio fixed at 1, no correction across families)."""
    return torch.ones(n_learner)


def hacpo_ratio(learner_logp: Tensor, gen_logprobs: np.ndarray | Tensor) -> Tensor:
    """HACPO's sequence ratio (arXiv 2603.02604): min(exp(mean_j logp_j - mean_i logq_i), 1), one value for
    every learner token, no filter. Each mean is in its own tokenizer's units, so it is not a density ratio;
    the clip at 1 means a peer's sample never counts for more than one's own."""
    lq = torch.as_tensor(_np64(gen_logprobs))
    if learner_logp.numel() == 0 or lq.numel() == 0:
        return torch.ones((), dtype=torch.float64)
    delta = learner_logp.detach().to(torch.float64).mean() - lq.mean()
    return delta.exp().clamp(max=1.0)


def per_byte_ratio(
    learner_logp: Tensor, gen_logprobs: np.ndarray | Tensor, n_bytes: int, finished: bool, cap: float
) -> Tensor:
    """A per-byte geometric-mean sequence ratio: min(exp((sum logp - sum logq) / max(1, bytes + finished)), C)
    on every learner token, no filter (the stop counts as one byte). A baseline for the issue's comparison:
    the whole-sequence density ratio, tamed by taking its per-byte root instead of aligning segments."""
    delta = learner_logp.detach().to(torch.float64).sum() - float(_np64(gen_logprobs).sum())
    return (delta / max(1, n_bytes + int(finished))).exp().clamp(max=cap)


def text_ratio_weights(
    kind: str, learner_logp: Tensor, gen_logprobs: np.ndarray | Tensor, alignment: Alignment, cap: float
) -> tuple[Tensor, bool]:
    """(per learner token weight [n] detached float64, whether the divergence filter applies) for one
    completion under a text-ratio ``kind`` of TEXT_RATIOS; the benchmark's arms side by side."""
    if kind not in TEXT_RATIOS:
        raise ValueError(f"unknown text ratio {kind!r}; expected one of {tuple(TEXT_RATIOS)}")
    n = alignment.n_learner
    lp = learner_logp.detach().to(torch.float64)
    if kind in ("segment", "segment_nofilter"):
        rho_k = segment_weights(segment_log_ratios(lp, gen_logprobs, alignment), cap)
        w = rho_k[torch.from_numpy(alignment.learner_segments())]
    elif kind == "one":
        w = ratio_one(n).to(torch.float64)
    elif kind == "hacpo":
        w = hacpo_ratio(lp, gen_logprobs).expand(n).clone()
    else:
        w = per_byte_ratio(lp, gen_logprobs, alignment.n_bytes, alignment.end_segment, cap).expand(n).clone()
    return w, TEXT_RATIOS[kind]


def segment_sum(values: Tensor, segments: Tensor) -> Tensor:
    """[B, T] values summed into their row's segment columns ([B, T]; column k = segment k, zeros where no
    token maps). Differentiable. A column that receives one value holds it exactly (0.0 + x)."""
    return torch.zeros_like(values).scatter_add(1, segments, values)


def spread(per_segment: Tensor, segments: Tensor) -> Tensor:
    """[B, T] per-segment values back onto each token of the segment (the inverse layout of segment_sum)."""
    return per_segment.gather(1, segments)


def _np64(values: np.ndarray | Tensor) -> np.ndarray:
    if isinstance(values, Tensor):
        return values.detach().cpu().to(torch.float64).numpy()
    return np.asarray(values, dtype=np.float64)
