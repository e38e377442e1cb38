"""The project's benchmarks: each module is one benchmark, run from the repository root as

    python -m benchmarks.NAME [--quick] [--seeds N] [--seed S] [--json PATH] ...

benchmarks/README.md lists them (what each measures, its default and quick sizes, its docs/results/
page and section). Shared pieces, in tooling/ since the tests check them too: `tooling.benchmark_nodes` (a GRPO
node's config and its held-out score) and `tooling.benchmark_args` (the seed, size and JSON arguments every
benchmark takes).
"""
