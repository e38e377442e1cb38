"""What tests and benchmarks share, run from a checkout (never installed: the wheel ships swarm_node only).

    fuzzing            the one fuzz harness: random values, per-case bookkeeping (FuzzStats, run_case),
                       seeds, report
    batch_fuzz         the rollout-batch decoder (protocol/): mutations, bombs, the invariants of
                       docs/protocol.md
    params_fuzz        the DPO parameter codec and its receive path (swarm_node/swarm/averaging/)
    record_fuzz        the DHT record validators and the reader of signed records (swarm/)
    batches            rollout batches for wire measurements and codec tests, and their JSON fixtures
    adversary          a misbehaving GRPO peer, a real process (`python tooling/adversary.py`), and its
                       side-by-side run
    dpo_adversary      a hostile DPO neighbour: in-process (HostileNeighbour) and as a real process
    stallers           identities that announce batches and never deliver them
    dht_flood          a hivemind DHT peer that floods a node's DHT with StoreRequests
    dpo_ring           DPO rounds of real swarm peers on a ring, and a DHT child killed under them
    dpo_swarm          a fake DPO swarm for in-process tests of the round policy
    netlab             network namespaces, NAT routers and tc caps (`python -m tooling.netlab`,
                       scripts/netlab.sh)
    net_scenarios      real nodes in a NetLab: peers behind NAT, a bootstrap that dies
    browser            headless Chromium from Debian's packages, for the dashboard
    full_disk          a full disk (tmpfs, file size limits) for the checkpoint and metrics writers
    choco              CHOCO-Gossip, measured by benchmarks/dpo_topology.py (no node runs it)
    benchmark_args     the --quick/--seeds/--seed/--json arguments every benchmark takes, and its JSON record
    benchmark_nodes    a benchmark's GRPO node config and its held-out score (the node's own evaluation)
    newcomer_rounds    one receiving node's round choice with the real intake and newcomer gate, simulated
    byzantine_summary  a Byzantine DPO run's paired summary (benchmarks/dpo_byzantine.py)
    loopback           a private network namespace (`unshare -rn` re-exec) and its loopback byte counter, for
                       benchmarks that count every byte a swarm sends (swarm_scale, control_costs)
    swarm_sim          the control-plane simulator (SimPy): membership, announcements, downloads and DHT
                       lookups at 100-10,000 peers, checked against real peers (benchmarks/swarm_sim.py)

Tests and benchmarks both import from here and never from each other (tests/test_architecture.py checks
it, and that the package imports none of tests/, benchmarks/ or tooling/; tests/test_packaging.py that the
wheel ships none of it). Run from the repository root, which pytest's pythonpath and `python -m` put first.
"""
