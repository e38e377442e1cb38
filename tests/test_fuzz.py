"""A short run of the fuzzers behind benchmarks/fuzz_decode.py (which runs 100,000 cases)."""

from __future__ import annotations

import logging

from swarm_node.protocol import fuzz as pf
from swarm_node.swarm import fuzz as sf


def test_decoder_fuzz_finds_no_exception_and_no_invariant_violation() -> None:
    parts = pf.run(2000, seed=11)
    for name, st in parts.items():
        assert st.exceptions == [], (name, st.exceptions[:3])
        assert st.violations == [], (name, st.violations[:3])
        assert st.accepted > 0  # some mutations keep a valid batch: the invariants are really checked
        assert len(st.reasons) >= 12, (name, st.reasons)  # the mutations reach deep checks, not only the header
    assert parts["default"].by_family["bomb"] == len(pf.bombs())


def test_record_fuzz_finds_no_exception_and_no_invariant_violation(caplog) -> None:
    with caplog.at_level(logging.ERROR):
        st = sf.run_records(400, seed=5)
    assert st.exceptions == [] and st.violations == []
    assert st.accepted > 0 and st.reasons["refused"] > 0
