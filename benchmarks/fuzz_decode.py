"""Fuzz the batch decoder and the DHT record validators with structure-aware mutations and random bytes.

Cases (swarm_node.protocol.fuzz and swarm_node.swarm.fuzz): valid batches with their msgpack body mutated
field by field, encoded payloads with their bytes damaged, random bytes (raw, behind a valid header, in
a valid zstd frame), the bombs of issue 11, under the default DecodeLimits and under tight limits of the
size a tiny node derives; and member records / announcements mutated, signed or not, under our swarm's
keys or another's. Prints, per part: cases, accepted, exceptions other than ProtocolError (must be 0),
accepted payloads that break the documented invariants (must be 0), the slowest case, and the peak RSS,
each against a budget; exits 1 if any is over.

    python benchmarks/fuzz_decode.py --cases 100000 --seed 0 --json fuzz.json
    python benchmarks/fuzz_decode.py --quick
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import time

from swarm_node.protocol import fuzz as pf
from swarm_node.swarm import fuzz as sf

SLOWEST_BUDGET_S = 0.5  # CPU seconds of one case (thread time, so a loaded machine does not inflate it)
PEAK_RSS_BUDGET_MIB = 768  # the whole process: interpreter, numpy, hivemind, and the largest decode


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000, help="total cases (decoder and records together)")
    ap.add_argument("--record-share", type=float, default=0.1, help="fraction of the cases spent on DHT records")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="5,000 cases")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # refusals are expected by the thousand; the counts are what matter
    total = 5_000 if args.quick else args.cases
    n_records = int(total * args.record_share)
    n_decode = total - n_records
    t0 = time.time()
    decode = pf.run(n_decode, args.seed, progress=lambda i: print(f"  decoder cases: {i}", flush=True))
    records = sf.run_records(n_records, args.seed)
    parts = {f"decoder/{k}": v for k, v in decode.items()} | {"records": records}
    rss = peak_rss_mib()
    print(f"\n{'part':<18} {'cases':>8} {'accepted':>9} {'other exc':>10} {'violations':>11} {'slowest cpu s':>13}  slowest case")
    for name, st in parts.items():
        print(f"{name:<18} {st.cases:>8} {st.accepted:>9} {len(st.exceptions):>10} {len(st.violations):>11} "
              f"{st.slowest_s:>13.4f}  {st.slowest_case}")
    all_cases = sum(st.cases for st in parts.values())
    exceptions = sum(len(st.exceptions) for st in parts.values())
    violations = sum(len(st.violations) for st in parts.values())
    slowest = max(parts.values(), key=lambda st: st.slowest_s)
    print(f"\ntotal cases {all_cases} in {time.time() - t0:.0f}s; other exceptions {exceptions} (must be 0); "
          f"invariant violations {violations} (must be 0)")
    print(f"slowest case {slowest.slowest_s:.4f}s ({slowest.slowest_case}), budget {SLOWEST_BUDGET_S}s; "
          f"peak RSS {rss:.0f} MiB, budget {PEAK_RSS_BUDGET_MIB} MiB")
    for name, st in parts.items():
        for case, err in st.exceptions[:5]:
            print(f"  EXCEPTION {name} {case}: {err}")
        for case, bad in st.violations[:5]:
            print(f"  VIOLATION {name} {case}: {bad}")
    reasons = {name: dict(st.reasons.most_common()) for name, st in parts.items()}
    print("refusal reasons:", json.dumps(reasons))
    ok = exceptions == 0 and violations == 0 and slowest.slowest_s <= SLOWEST_BUDGET_S and rss <= PEAK_RSS_BUDGET_MIB
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seed": args.seed, "cases": all_cases, "other_exceptions": exceptions, "violations": violations,
                       "slowest_s": slowest.slowest_s, "slowest_case": slowest.slowest_case, "peak_rss_mib": rss,
                       "budgets": {"slowest_s": SLOWEST_BUDGET_S, "peak_rss_mib": PEAK_RSS_BUDGET_MIB},
                       "machine": platform.platform(), "parts": {k: v.summary() for k, v in parts.items()}},
                      fh, indent=1, default=str)
    print("OK" if ok else "OVER BUDGET OR FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
