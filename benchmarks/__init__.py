"""The project's benchmarks: each module is one benchmark, run from the repository root as

    python -m benchmarks.NAME [--quick] [--seeds N] [--seed S] [--json PATH] ...

benchmarks/README.md lists them (what each measures, its default and quick sizes, its docs/results/
section). Shared pieces: `benchmarks.nodes` (a GRPO node's config and its held-out score) and
`benchmarks.args` (the seed, size and JSON arguments every benchmark takes).
"""
