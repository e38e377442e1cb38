"""What one F-TIS step takes and reports: the prepared sequences, one pass's per-sequence diagnostics, the
step's result (the GRPO round's metrics row copies it), and how the micro-batches' diagnostics are put back in
batch order (training/ftis_step.py runs the step)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from swarm_node.training.ftis import LossDiagnostics


@dataclass
class TrainSequence:
    """One completion ready for the forward pass: prompt + completion ids and its group advantage."""

    ids: np.ndarray
    prompt_len: int
    behaviour: np.ndarray
    advantage: float
    local: bool

    @property
    def completion_len(self) -> int:
        return len(self.ids) - self.prompt_len


@dataclass
class PreparedBatch:
    """The sequences of one round after group selection, plus what was dropped and why."""

    sequences: list[TrainSequence]
    groups_local: int = 0
    groups_external: int = 0
    groups_zero_advantage: int = 0
    groups_dropped_external: int = 0
    empty_completions: int = 0


@dataclass
class PassStats:
    """What one forward/backward pass over the batch saw (per-sequence, in batch order)."""

    loss: float
    kept: np.ndarray
    filtered: np.ndarray
    ratio_mean: np.ndarray
    truncated_frac: np.ndarray
    divergence: np.ndarray
    n_tokens: np.ndarray
    clipped_frac: np.ndarray
    logp: list[Tensor]

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())


@dataclass
class StepResult:
    """Outcome of FTISTrainer.step; ``stepped`` False with ``reason`` when no optimizer step was taken."""

    stepped: bool
    reason: str | None = None
    loss: float = float("nan")
    losses: list[float] = field(default_factory=list)
    grad_norm: float = float("nan")
    grad_norms: list[float] = field(default_factory=list)
    optimizer_steps: int = 0
    lr: float = float("nan")
    groups_local: int = 0
    groups_external: int = 0
    groups_zero_advantage: int = 0
    groups_dropped_external: int = 0
    seqs_kept: int = 0
    seqs_filtered: int = 0
    seqs_kept_local: int = 0
    seqs_kept_external: int = 0
    seqs_filtered_local: int = 0
    seqs_filtered_external: int = 0
    mean_ratio: float = float("nan")
    mean_ratio_local: float = float("nan")
    mean_ratio_external: float = float("nan")
    truncated_frac: float = float("nan")
    truncated_frac_external: float = float("nan")
    mean_divergence_external: float = float("nan")
    clipped_frac: float = float("nan")
    completion_tokens: int = 0
    total_tokens: int = 0
    oom_retries: int = 0  # times this step ran out of memory and was retried with half the token budget
    micro_batch_tokens: int = 0  # the token budget the step ended with
    seconds: float = 0.0


def token_mean(values: np.ndarray, weights: np.ndarray, select: np.ndarray | None = None) -> float:
    w = weights.astype(np.float64) * (select if select is not None else 1.0)
    total = float(w.sum())
    return float((values.astype(np.float64) * w).sum() / total) if total > 0 else float("nan")


def collect_pass(n: int, diags: list[tuple[list[int], LossDiagnostics]], logps: list[Tensor]) -> PassStats:
    """Scatter micro-batch diagnostics back into batch order."""
    arrays = {
        k: np.zeros(n, dtype=np.float64)
        for k in ("ratio_mean", "truncated_frac", "divergence", "clipped_frac")
    }
    kept, filtered, n_tok = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, np.int64)
    for idx, d in diags:
        for key, arr in arrays.items():
            arr[idx] = getattr(d, key).cpu().numpy()
        kept[idx] = d.kept.cpu().numpy()
        filtered[idx] = d.filtered.cpu().numpy()
        n_tok[idx] = d.n_tokens.cpu().numpy()
    return PassStats(loss=0.0, kept=kept, filtered=filtered, n_tokens=n_tok, logp=logps, **arrays)


def fill_first_pass(res: StepResult, batch: PreparedBatch, s: PassStats) -> None:
    """Diagnostics describe the batch as it arrived (first pass, before any update of this round)."""
    local = np.array([q.local for q in batch.sequences])
    ext = ~local
    res.seqs_kept, res.seqs_filtered = int(s.kept.sum()), int(s.filtered.sum())
    res.seqs_kept_local, res.seqs_kept_external = int((s.kept & local).sum()), int((s.kept & ext).sum())
    res.seqs_filtered_local = int((s.filtered & local).sum())
    res.seqs_filtered_external = int((s.filtered & ext).sum())
    res.mean_ratio = token_mean(s.ratio_mean, s.n_tokens)
    res.mean_ratio_local = token_mean(s.ratio_mean, s.n_tokens, local)
    res.mean_ratio_external = token_mean(s.ratio_mean, s.n_tokens, ext)
    res.truncated_frac = token_mean(s.truncated_frac, s.n_tokens)
    res.truncated_frac_external = token_mean(s.truncated_frac, s.n_tokens, ext)
    ext_nonempty = ext & (s.n_tokens > 0)
    res.mean_divergence_external = (
        float(s.divergence[ext_nonempty].mean()) if ext_nonempty.any() else float("nan")
    )
    res.clipped_frac = 0.0  # no clip on the first pass; later passes overwrite it
    res.completion_tokens = int(s.n_tokens.sum())
    res.total_tokens = int(sum(len(q.ids) for q in batch.sequences))
