"""Test tooling: the fuzzers and test-batch builders that tests and benchmarks share (never installed).

    fuzzing       the one fuzz harness: random values, per-case bookkeeping (FuzzStats, run_case), seeds, report
    batch_fuzz    the rollout-batch decoder (protocol/): mutations, bombs, the invariants of docs/protocol.md
    params_fuzz   the DPO parameter codec and its receive path (gossip/)
    record_fuzz   the DHT record validators and the reader of signed records (swarm/)
    batches       rollout batches for wire measurements and codec tests, and their JSON fixtures

They live under tests/ rather than in the swarm_node package, so the wheel ships none of them
(tests/test_packaging.py checks it); benchmarks import them from a checkout (docs/architecture.md).
"""
