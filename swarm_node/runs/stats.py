"""The statistics every benchmark and results table uses: mean +- std over seeds, paired standard errors,
and a verdict that says "cannot tell" when that is the truth.

At n = 400 held-out problems one accuracy has a standard error of about 2.4 points, and seeds differ by
1-3 points, so a difference is claimed only when it exceeds two standard errors of the paired difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean_std(values: Sequence[float | None]) -> tuple[float, float]:
    """Mean and sample std (ddof 1) of the values that are not None; (nan, nan) when there are none."""
    a = np.asarray([v for v in values if v is not None], dtype=float)
    if a.size == 0:
        return float("nan"), float("nan")
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def paired_se(a_hits: Sequence[bool], b_hits: Sequence[bool]) -> float:
    """Standard error of mean(a) - mean(b) when both were scored on the same problems (per-problem pairs)."""
    if len(a_hits) != len(b_hits):
        raise ValueError(f"paired samples differ in length: {len(a_hits)} vs {len(b_hits)}")
    d = np.asarray(a_hits, dtype=float) - np.asarray(b_hits, dtype=float)
    return float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan")


def gain_with_se(a_acc: float, b_acc: float, a_hits: Sequence | str | None = None, b_hits: Sequence | str | None = None,
                 a_n: int | None = None, b_n: int | None = None) -> dict:
    """One run's a - b (say the swarm's end accuracy minus alone's) with its SE and the 2-SE verdict.

    Paired per problem when both were scored on the same problems (per-problem hits of equal length, as
    metrics.jsonl's eval_hits: "0110..." or 0/1 values); otherwise the unpaired SE of two accuracies (larger),
    from their problem counts; nan when neither is known. The SE counts the problems drawn, not seeds.
    """
    diff = a_acc - b_acc
    if a_hits and b_hits and len(a_hits) == len(b_hits):
        se, paired = paired_se([str(c) == "1" for c in a_hits], [str(c) == "1" for c in b_hits]), True
    elif a_n and b_n:
        se, paired = math.sqrt(a_acc * (1 - a_acc) / a_n + b_acc * (1 - b_acc) / b_n), False
    else:
        se, paired = float("nan"), False
    return {"gain": diff, "se": se, "paired": paired, "verdict": verdict(diff, se)}


def seeds_se(diffs: Sequence[float]) -> float:
    """Standard error of the mean of per-seed paired differences (seed-to-seed spread included)."""
    d = np.asarray(diffs, dtype=float)
    return float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan")


def combined_se(per_seed_se: Sequence[float], diffs: Sequence[float]) -> float:
    """SE of the mean difference over seeds: the larger of the across-seed SE and the mean within-seed
    paired SE / sqrt(seeds), so one seed (no spread to measure) still gets an honest error bar."""
    within = float(np.mean(per_seed_se)) / math.sqrt(len(per_seed_se)) if per_seed_se else float("nan")
    across = seeds_se(diffs)
    return within if math.isnan(across) else max(within, across)


def paired_difference(pairs: Sequence[tuple[dict, dict]], acc: str, hits: str) -> tuple[float, float, str]:
    """For runs (a, b) of the same seeds scored on the same problems: the mean over seeds of a[acc] - b[acc], its
    SE (`combined_se` of the per-problem paired SEs of a[hits], b[hits] and the spread over seeds) and the 2-SE
    verdict. The benchmarks' one way of comparing two arms."""
    return linear_contrast([[(1.0, a[hits], a[acc]), (-1.0, b[hits], b[acc])] for a, b in pairs])


def linear_contrast(seeds: Sequence[Sequence[tuple[float, Sequence[bool], float]]]) -> tuple[float, float, str]:
    """A weighted sum of accuracies of runs scored on the same problems, e.g. "gain - half another's gain".

    For each seed, terms (weight, per-problem hits, accuracy): the mean over seeds of sum(w * accuracy), its SE
    (`combined_se` of the per-problem SE of sum(w * hits) and the spread over seeds) and the 2-SE verdict.
    `paired_difference` is the case of two terms with weights +1 and -1.
    """
    values, per_seed_se = [], []
    for terms in seeds:
        lengths = {len(h) for _, h, _ in terms}
        if len(lengths) != 1:
            raise ValueError(f"paired samples differ in length: {sorted(lengths)}")
        d = sum(w * np.asarray(h, dtype=float) for w, h, _ in terms)
        per_seed_se.append(float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan"))
        values.append(sum(w * acc for w, _, acc in terms))
    mean = float(np.mean(values))
    se = combined_se(per_seed_se, values)
    return mean, se, verdict(mean, se)


def verdict(diff: float, se: float, k: float = 2.0) -> str:
    """'higher' / 'lower' when |diff| > k SE, else 'cannot tell' (also when the SE is unknown)."""
    if math.isnan(diff) or math.isnan(se) or se <= 0 and diff == 0:
        return "cannot tell"
    if abs(diff) > k * se:
        return "higher" if diff > 0 else "lower"
    return "cannot tell"


def fmt_ms(ms: tuple[float, float], spec: str = ".3f") -> str:
    m, s = ms
    return "-" if math.isnan(m) else f"{m:{spec}} +- {s:{spec}}"
