"""The one fuzz harness: random values, per-case bookkeeping, seeds, and the report every fuzz benchmark prints.

Each fuzzer (batch_fuzz: the rollout-batch decoder; params_fuzz: the DPO parameter codec and its receive
path; record_fuzz: the DHT record validators) makes cases and hands each to `run_case` with the call
under test, the error type that is a refusal (counted by its `reason`), and the invariants an accepted
result must keep. Anything else the call raises is a missed check, recorded with the case; the CPU
time of every case is measured (thread time, so other processes do not inflate it).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

INT64_MAX = (1 << 63) - 1
EDGE_INTS = (0, 1, -1, 2, 255, 256, 65535, 65536, (1 << 24) - 1, 1 << 24, (1 << 32) - 1, 1 << 32, INT64_MAX,
             -(1 << 63), (1 << 64) - 1)


# ------------------------------------------------------------------------------------- random values


def pick(rng: np.random.Generator, seq):
    """One element of seq as it is (rng.choice would turn big ints into float64)."""
    return seq[int(rng.integers(0, len(seq)))]


def random_text(rng: np.random.Generator, max_len: int = 12) -> str:
    alphabet = "abcxyz019:_-é漢🙂"
    return "".join(alphabet[int(i)] for i in rng.integers(0, len(alphabet), int(rng.integers(0, max_len + 1))))


def random_object(rng: np.random.Generator, depth: int = 0) -> Any:
    """Any msgpack-encodable value, nested a little."""
    kind = int(rng.integers(0, 10 if depth < 2 else 7))
    if kind == 0:
        return None
    if kind == 1:
        return bool(rng.integers(0, 2))
    if kind == 2:
        return int(pick(rng, EDGE_INTS))
    if kind == 3:
        return float(pick(rng, [0.0, -0.0, 1.5, math.nan, math.inf, -math.inf, 1e308]))
    if kind == 4:
        return random_text(rng, 20)
    if kind == 5:
        return rng.bytes(int(rng.integers(0, 40)))
    if kind == 6:
        return int(rng.integers(-300, 300))
    if kind in (7, 8):
        return [random_object(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    return {random_text(rng, 5): random_object(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))}


# ------------------------------------------------------------------------------------------ running


@dataclass
class FuzzStats:
    cases: int = 0
    accepted: int = 0
    by_family: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    exceptions: list[tuple[str, str]] = field(default_factory=list)  # (case, "Type: message")
    violations: list[tuple[str, list[str]]] = field(default_factory=list)
    slowest_s: float = 0.0  # CPU seconds of this thread (time.thread_time): other processes do not inflate it
    slowest_case: str = ""
    seconds: float = 0.0

    def merge(self, other: FuzzStats) -> None:
        self.cases += other.cases
        self.accepted += other.accepted
        self.by_family.update(other.by_family)
        self.reasons.update(other.reasons)
        self.exceptions += other.exceptions
        self.violations += other.violations
        self.seconds += other.seconds
        if other.slowest_s > self.slowest_s:
            self.slowest_s, self.slowest_case = other.slowest_s, other.slowest_case

    def record(self, family: str, name: str, size: int, seconds: float, bad: list[str] | None) -> None:
        """Count one case: its CPU time (the slowest kept), and, if it was accepted, its invariant violations
        (`bad` None: refused or raised)."""
        self.cases += 1
        self.by_family[family] += 1
        self.seconds += seconds
        if seconds > self.slowest_s:
            self.slowest_s, self.slowest_case = seconds, f"{family}:{name} ({size} bytes)"
        if bad is not None:
            self.accepted += 1
            if bad:
                self.violations.append((f"{family}:{name}", bad))

    def summary(self) -> dict:
        return {
            "cases": self.cases, "accepted": self.accepted, "by_family": dict(self.by_family),
            "reasons": dict(self.reasons.most_common()), "other_exceptions": len(self.exceptions),
            "exception_examples": self.exceptions[:5], "invariant_violations": len(self.violations),
            "violation_examples": self.violations[:5], "slowest_s": round(self.slowest_s, 4),
            "slowest_case": self.slowest_case, "seconds": round(self.seconds, 2),
        }


class Refused(Exception):
    """What a call under test raises (or a fuzzer raises for it) when it refuses a case; counted by `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def run_case(stats: FuzzStats, family: str, name: str, size: int, call: Callable[[], Any], *,
             refusals: tuple[type[BaseException], ...], check: Callable[[Any], list[str]],
             after: Callable[[Any], None] | None = None) -> Any:
    """Run one case: `call()` -> the accepted result (its invariants checked by `check`), None (nothing
    accepted, nothing refused), or one of `refusals` (counted by its `reason`). Anything else it raises is
    recorded as an exception. `after(result or None)` runs inside the timed case (e.g. the receive path
    the same payload takes). Returns the accepted result or None."""
    t0 = time.thread_time()
    out = None
    try:
        out = call()
    except refusals as exc:
        stats.reasons[getattr(exc, "reason", type(exc).__name__)] += 1
    except Exception as exc:  # the point of fuzzing: any of these is a missed check
        stats.exceptions.append((f"{family}:{name}", f"{type(exc).__name__}: {str(exc)[:200]}"))
    if after is not None:
        after(out)
    dt = time.thread_time() - t0
    stats.record(family, name, size, dt, None if out is None else check(out))
    return out


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seed_shares(total: int, first_seed: int, seeds: int) -> list[tuple[int, int]]:
    """(seed, cases) for a run of `total` cases split as evenly as possible over `seeds` case streams."""
    return [(first_seed + i, total // seeds + (1 if i < total % seeds else 0)) for i in range(seeds)]


def merge_parts(into: dict[str, FuzzStats], parts: dict[str, FuzzStats]) -> dict[str, FuzzStats]:
    """Add one seed's per-part stats to the running per-part totals (parts keep their first-seen order)."""
    for name, st in parts.items():
        into.setdefault(name, FuzzStats()).merge(st)
    return into


def report(parts: dict[str, FuzzStats], wall_s: float, *, seed: int | list[int], json_path: str | None, slowest_budget_s: float,
           rss_budget_mib: float, label: str = "part") -> bool:
    """Print a fuzz run's table, totals and examples (and write them as JSON); True if within every budget.

    The verdict the fuzz benchmarks print: 0 exceptions other than the codec's own error, 0 accepted
    payloads that break an invariant, the slowest case and the peak RSS within their budgets."""
    import json
    import platform

    rss = peak_rss_mib()
    width = max([len(label), *map(len, parts)])
    print(f"\n{label:<{width}} {'cases':>8} {'accepted':>9} {'other exc':>10} {'violations':>11} {'slowest cpu s':>13}"
          "  slowest case")
    for name, st in parts.items():
        print(f"{name:<{width}} {st.cases:>8} {st.accepted:>9} {len(st.exceptions):>10} {len(st.violations):>11} "
              f"{st.slowest_s:>13.4f}  {st.slowest_case}")
    all_cases = sum(st.cases for st in parts.values())
    exceptions = sum(len(st.exceptions) for st in parts.values())
    violations = sum(len(st.violations) for st in parts.values())
    slowest = max(parts.values(), key=lambda st: st.slowest_s)
    print(f"\ntotal cases {all_cases} in {wall_s:.0f}s; other exceptions {exceptions} (must be 0); "
          f"invariant violations {violations} (must be 0)")
    print(f"slowest case {slowest.slowest_s:.4f}s ({slowest.slowest_case}), budget {slowest_budget_s}s; "
          f"peak RSS {rss:.0f} MiB, budget {rss_budget_mib} MiB")
    for name, st in parts.items():
        for case, err in st.exceptions[:5]:
            print(f"  EXCEPTION {name} {case}: {err}")
        for case, bad in st.violations[:5]:
            print(f"  VIOLATION {name} {case}: {bad}")
    reasons = {name: dict(st.reasons.most_common()) for name, st in parts.items()}
    print("refusal reasons:", json.dumps(reasons))
    ok = exceptions == 0 and violations == 0 and slowest.slowest_s <= slowest_budget_s and rss <= rss_budget_mib
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"seed": seed, "cases": all_cases, "other_exceptions": exceptions, "violations": violations,
                       "slowest_s": slowest.slowest_s, "slowest_case": slowest.slowest_case, "peak_rss_mib": rss,
                       "budgets": {"slowest_s": slowest_budget_s, "peak_rss_mib": rss_budget_mib},
                       "machine": platform.platform(), "parts": {k: v.summary() for k, v in parts.items()}},
                      fh, indent=1, default=str)
    print("OK" if ok else "OVER BUDGET OR FAILED")
    return ok
