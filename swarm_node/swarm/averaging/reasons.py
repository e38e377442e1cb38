"""Why a DPO node refused a neighbour's parameters: every reason, in one place.

Receivers count refusals by these names (`rejected` in metrics.jsonl), and the node exports them as they
are: peers cannot choose a name outside this list, so the exported label set stays bounded.
`PayloadError` refuses any other name.
"""

from __future__ import annotations

# the codec (swarm/averaging/payload.py): what a payload is on the wire
DECODE_REASONS: dict[str, str] = {
    "type": "the payload is not bytes",
    "too_large": "over the swarm's byte limit",
    "truncated": "shorter than its header or its announced tensor lengths",
    "bad_header": "wrong magic or version",
    "arch_mismatch": "another architecture fingerprint (names and shapes of the trainable parameters)",
    "wrong_count": "another number of tensors than ours",
    "bad_proto": "a tensor message that does not parse",
    "bad_encoding": "another compression than ours, or a dtype other than float32",
    "wrong_shape": "a tensor of another shape than ours",
    "wrong_size": "a tensor buffer of the wrong length, or an 8-bit codebook of the wrong size",
    "not_finite": "NaN or inf in a tensor",
    "trailing_bytes": "bytes after the last tensor",
}

# robust averaging (dpo/robust.py): well-formed parameters that no honest neighbour would send
ROBUST_REASONS: dict[str, str] = {
    "norm_outlier": "its difference from us (gossip) or from the median (federated) is over "
                    "dpo.outlier_factor times the median of our recent accepted differences",
    "replayed": "the same bytes as a payload received in an earlier round (honest nodes change every round)",
}

PARAM_REASONS: dict[str, str] = {**DECODE_REASONS, **ROBUST_REASONS}
