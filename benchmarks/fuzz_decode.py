"""Fuzz the batch decoder and the DHT record validators with structure-aware mutations and random bytes.

Cases (tooling/batch_fuzz.py and record_fuzz.py): valid batches with their msgpack body mutated
field by field, encoded payloads with their bytes damaged, random bytes (raw, behind a valid header, in
a valid zstd frame), the bombs of issue 11, under the default DecodeLimits and under tight limits of the
size a tiny node derives; and member records / announcements mutated, signed or not, under our swarm's
keys or another's. Prints, per part: cases, accepted, exceptions other than ProtocolError (must be 0),
accepted payloads that break the documented invariants (must be 0), the slowest case, and the peak RSS,
each against a budget; exits 1 if any is over.

    python -m benchmarks.fuzz_decode --cases 100000 --seed 0 --json fuzz.json
    python -m benchmarks.fuzz_decode --quick
"""

from __future__ import annotations

import argparse
import logging
import time

from tooling import batch_fuzz as pf  # the fuzzers the tests run too (tooling/, not the package)
from tooling import record_fuzz as sf
from tooling.benchmark_args import add_run_args, resolve_seeds
from tooling.fuzzing import merge_parts, report, seed_shares

SLOWEST_BUDGET_S = 0.5  # CPU seconds of one case (thread time, so a loaded machine does not inflate it)
PEAK_RSS_BUDGET_MIB = 768  # the whole process: interpreter, numpy, hivemind, and the largest decode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000, help="total cases (decoder and records together)")
    ap.add_argument("--record-share", type=float, default=0.1, help="fraction of the cases spent on DHT records")
    add_run_args(ap, seeds=1, quick="5,000 cases", seeds_help="split the cases over this many seeds' case streams")
    args = ap.parse_args()
    resolve_seeds(args)
    logging.disable(logging.WARNING)  # refusals are expected by the thousand; the counts are what matter
    total = 5_000 if args.quick else args.cases
    n_records = int(total * args.record_share)
    n_decode = total - n_records
    t0 = time.time()
    parts: dict = {}
    for (seed, n_dec), (_, n_rec) in zip(seed_shares(n_decode, args.seed, args.seeds),
                                         seed_shares(n_records, args.seed, args.seeds), strict=True):
        decode = pf.run(n_dec, seed, progress=lambda c, s=seed: print(f"  seed {s} decoder cases: {c}", flush=True))
        merge_parts(parts, {f"decoder/{k}": v for k, v in decode.items()} | {"records": sf.run_records(n_rec, seed)})
    ok = report(parts, time.time() - t0, seed=list(range(args.seed, args.seed + args.seeds)), json_path=args.json,
                slowest_budget_s=SLOWEST_BUDGET_S, rss_budget_mib=PEAK_RSS_BUDGET_MIB, label="part")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
