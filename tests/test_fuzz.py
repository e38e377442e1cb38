"""A short run of the fuzzers behind benchmarks/fuzz_decode.py (which runs 100,000 cases)."""

from __future__ import annotations

import logging

from tooling import batch_fuzz as pf
from tooling import record_fuzz as sf


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


def test_dpo_parameter_fuzz_finds_no_exception_and_no_invariant_violation() -> None:
    """A short run of benchmarks/fuzz_params.py: the DPO payload codec and gossip_step's receive path."""
    import warnings

    from tooling import params_fuzz as gf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hivemind's 8-bit encoder: a torch deprecation warning per call
        parts = gf.run(1000, seed=3, receive_share=0.2)
    for name, st in parts.items():
        assert st.exceptions == [], (name, st.exceptions[:3])
        assert st.violations == [], (name, st.violations[:3])
    assert parts["valid"].accepted == parts["valid"].cases > 0  # unmutated payloads pass: the check is not vacuous
    assert parts["field"].accepted > 0  # some mutations keep a valid payload (unknown fields, requires_grad...)
    reasons = sum((st.reasons for st in parts.values()), start=type(parts["field"].reasons)())
    assert {"bad_header", "arch_mismatch", "wrong_count", "truncated", "bad_proto", "bad_encoding", "wrong_shape",
            "wrong_size", "not_finite", "trailing_bytes", "too_large"} <= set(reasons), reasons
    assert parts["bomb"].cases == 3 * 7 and parts["bomb"].accepted == 0


def test_the_mutator_survives_its_own_earlier_mutations() -> None:
    """Seed 1's stream once crashed the fuzzer itself: a column mutation put a float in the prompt-template
    list and a later template mutation called str.replace on it."""
    parts = pf.run(1500, seed=1, with_bombs=False)  # the crash came between cases 1000 and 1500
    assert sum(st.cases for st in parts.values()) == 1500


def test_the_params_fuzzer_frames_follow_the_codecs_real_layout() -> None:
    """The fuzzer takes payloads apart from the documented layout (docs/dpo.md), not the codec's structs: a
    real payload must split into the header the codec wrote and rejoin to the same bytes."""
    import numpy as np
    import torch

    from swarm_node.swarm.averaging.payload import MAGIC, VERSION, encode_params
    from tooling import params_fuzz as gf

    tensors = [torch.ones(3, 4), torch.zeros(5)]
    for compression in ("none", "float16", "uint8"):
        payload = encode_params(tensors, gf.ARCH, compression)
        head, msgs = gf.split(payload)
        assert head == (MAGIC, VERSION, gf.ARCH.encode(), 2) and len(msgs) == 2
        assert gf.join(head, msgs) == payload
    shapes, compression, valid, _own = gf.random_base(np.random.default_rng(0))
    assert gf.join(*gf.split(valid)) == valid
