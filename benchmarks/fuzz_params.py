"""Fuzz the DPO parameter payload codec (swarm/averaging/payload.py) and its receive path (mixing.gossip_step).

Cases (tooling/params_fuzz.py): valid payloads of random shapes, values and compressions (none, float16,
uint8) with a header field, a length prefix or a field of a tensor's protobuf message mutated; payload
bytes damaged; random bytes; bombs (huge counts, lengths, shapes, unknown fields, the size bound). One case
in ten also goes through gossip_step as a neighbour's payload. Prints, per family: cases, accepted,
exceptions other than PayloadError (must be 0), accepted payloads that break the invariants (must be 0),
the slowest case (thread CPU time) and the peak RSS, each against a budget; exits 1 if any is over.

    python -m benchmarks.fuzz_params --cases 100000 --seed 0 --json fuzz_params.json
    python -m benchmarks.fuzz_params --quick
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

import torch

from tooling import params_fuzz as gf  # the fuzzers the tests run too (tooling/, not the package)
from tooling.benchmark_args import add_run_args, resolve_seeds
from tooling.fuzzing import merge_parts, report, seed_shares

SLOWEST_BUDGET_S = 0.5  # CPU seconds of one case
PEAK_RSS_BUDGET_MIB = 768  # the whole process: interpreter, torch, hivemind, and the largest decode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    add_run_args(ap, seeds=1, quick="5,000 cases", seeds_help="split the cases over this many seeds' case streams")
    ap.add_argument("--receive-share", type=float, default=0.1, help="fraction also run through gossip_step")
    ap.add_argument("--max-bytes", type=int, default=1 << 20, help="the receiver's size bound")
    args = ap.parse_args()
    resolve_seeds(args)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # refusals are expected by the thousand; the counts are what matter
    warnings.simplefilter("ignore")  # hivemind's 8-bit encoder warns about a deprecated torch API on every call
    total = 5_000 if args.quick else args.cases
    t0 = time.time()
    parts: dict = {}
    for seed, n in seed_shares(total, args.seed, args.seeds):
        merge_parts(parts, gf.run(n, seed, receive_share=args.receive_share, max_bytes=args.max_bytes,
                                  progress=lambda c, s=seed: print(f"  seed {s} cases: {c}", flush=True)))
    ok = report(parts, time.time() - t0, seed=list(range(args.seed, args.seed + args.seeds)), json_path=args.json,
                slowest_budget_s=SLOWEST_BUDGET_S, rss_budget_mib=PEAK_RSS_BUDGET_MIB, label="family")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
