"""Fuzz the DPO parameter payload codec (gossip/payload.py) and its receive path (mixing.gossip_step).

Cases (swarm_node.gossip.fuzz): valid payloads of random shapes, values and compressions (none, float16,
uint8) with a header field, a length prefix or a field of a tensor's protobuf message mutated; payload
bytes damaged; random bytes; bombs (huge counts, lengths, shapes, unknown fields, the size bound). One case
in ten also goes through gossip_step as a neighbour's payload. Prints, per family: cases, accepted,
exceptions other than PayloadError (must be 0), accepted payloads that break the invariants (must be 0),
the slowest case (thread CPU time) and the peak RSS, each against a budget; exits 1 if any is over.

    python benchmarks/fuzz_params.py --cases 100000 --seed 0 --json fuzz_params.json
    python benchmarks/fuzz_params.py --quick
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import time
import warnings

import torch

from swarm_node.gossip import fuzz as gf

SLOWEST_BUDGET_S = 0.5  # CPU seconds of one case
PEAK_RSS_BUDGET_MIB = 768  # the whole process: interpreter, torch, hivemind, and the largest decode


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--receive-share", type=float, default=0.1, help="fraction also run through gossip_step")
    ap.add_argument("--max-bytes", type=int, default=1 << 20, help="the receiver's size bound")
    ap.add_argument("--quick", action="store_true", help="5,000 cases")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # refusals are expected by the thousand; the counts are what matter
    warnings.simplefilter("ignore")  # hivemind's 8-bit encoder warns about a deprecated torch API on every call
    total = 5_000 if args.quick else args.cases
    t0 = time.time()
    parts = gf.run(total, args.seed, receive_share=args.receive_share, max_bytes=args.max_bytes,
                   progress=lambda i: print(f"  cases: {i}", flush=True))
    rss = peak_rss_mib()
    print(f"\n{'family':<8} {'cases':>8} {'accepted':>9} {'other exc':>10} {'violations':>11} {'slowest cpu s':>13}  slowest case")
    for name, st in parts.items():
        print(f"{name:<8} {st.cases:>8} {st.accepted:>9} {len(st.exceptions):>10} {len(st.violations):>11} "
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
