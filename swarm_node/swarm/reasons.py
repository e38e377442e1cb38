"""Every reason the swarm layer counts, in one registry (peers choose none of these names).

A refusal of what a peer sent or did is counted under one of `REJECTED` (`SwarmPeer.stats()["rejected"]`;
a node's metrics show it as `swarm:<reason>`, docs/protocol.md lists what each means). What the node's
own validator refuses is counted under the validator's reasons (`payload_refused`), except a validator
that raises something else, which is the swarm's `VALIDATE_ERROR`. `EVENTS` are buffer events that are
no peer's fault. The set is fixed: `SwarmCounters.reject` refuses any other name, so the labels a node
exports stay bounded. No imports: the node side and tools read this module as data.
"""

from __future__ import annotations

# ---- downloading a blob (swarm/transfer.py, the download side) ----
TIMEOUT = "timeout"  # no complete blob (or no DHT announcement of it) within the deadline
STALLED = "stalled"  # no byte for download_stall_s: a stream that did not open, or a sender that stopped
TOO_LARGE = "too_large"  # announced or sent more bytes than the cap of its kind (batch: max_batch_bytes or the
# GRPO node's receive limits; params: dpo.max_payload_bytes)
STREAM_ERROR = "stream_error"  # the stream could not be opened or broke mid-blob (retried)
NOT_FOUND = "not_found"  # the peer no longer keeps that round
BUSY = "busy"  # the peer had no upload slot free (retried within the deadline, never counted on its own)
SIZE_MISMATCH = "size_mismatch"  # the length sent differs from the announced size
DIGEST_MISMATCH = "digest_mismatch"  # the bytes do not hash to the announced sha256

# ---- serving a blob (swarm/transfer.py, the upload side) ----
BAD_REQUEST = "bad_request"  # a request that breaks the wire format
REQUEST_TIMEOUT = "request_timeout"  # no complete request after the stream opened
UPLOAD_BUSY = "upload_busy"  # too many streams from one peer, or no upload slot free in time
UPLOAD_TIMEOUT = "upload_timeout"  # the requester stopped reading: upload cut off

# ---- pushed announcements and the intake's freshness rules (swarm/announce.py, swarm/intake.py) ----
BAD_ANNOUNCEMENT = "bad_announcement"  # not a valid announcement message
BAD_TIME = "bad_time"  # generation time not a positive finite number
FUTURE_TIME = "future_time"  # generated later than our clock plus max_clock_skew_s
BAD_VERSION = "bad_version"  # a policy version above its round
FUTURE_ROUND = "future_round"  # a round more than max_version_jump past what its sender signed
STALE_AGE = "stale_age"  # older than max_batch_age_s by its sender's clock
STALE_VERSION = "stale_version"  # more than max_version_lag of its sender's versions behind its newest

# ---- signed DHT records: read by us (swarm/membership.py), stored by our DHT child (records.py, dht_bounds.py) ----
BAD_RECORD = "bad_record"  # a record that does not parse, or names another peer than its signer
RECORD_TOO_LARGE = "record_too_large"
RECORD_TTL = "record_ttl"
RECORD_SHAPE = "record_shape"
RECORD_OWNER = "record_owner"
SUBKEYS_FULL = "subkeys_full"
STORAGE_FULL = "storage_full"
STORE_TOO_LARGE = "store_too_large"  # a StoreRequest of more keys or records than one request may carry
STORE_MALFORMED = "store_malformed"  # a StoreRequest whose fields disagree, or a dictionary store of no dictionary

# ---- the node's validator (swarm/receiver.py) ----
VALIDATE_ERROR = "validate_error"  # the validator raised something other than PayloadRefused

TRANSFER_REASONS = (TIMEOUT, STALLED, TOO_LARGE, STREAM_ERROR, NOT_FOUND, BUSY, SIZE_MISMATCH, DIGEST_MISMATCH)
UPLOAD_REASONS = (BAD_REQUEST, REQUEST_TIMEOUT, UPLOAD_BUSY, UPLOAD_TIMEOUT)
OFFER_REASONS = (TOO_LARGE, BAD_TIME, FUTURE_TIME, BAD_VERSION, FUTURE_ROUND, STALE_AGE, STALE_VERSION)
"""Intake verdicts that refuse a peer's batch (the intake counts them itself)."""
RECORD_REASONS = (RECORD_TOO_LARGE, RECORD_TTL, RECORD_SHAPE, RECORD_OWNER, SUBKEYS_FULL, STORAGE_FULL,
                  STORE_TOO_LARGE, STORE_MALFORMED)
"""What a DHT child refuses to store (counted in that process, read back at each heartbeat)."""

REJECTED = tuple(dict.fromkeys((*TRANSFER_REASONS, *UPLOAD_REASONS, BAD_ANNOUNCEMENT, *OFFER_REASONS, BAD_RECORD,
                                *RECORD_REASONS, VALIDATE_ERROR)))
"""Every key `stats()["rejected"]` can hold."""

EVICTED = "evicted"  # the buffer was full: its oldest arrival made room
SUPERSEDED = "superseded"  # a newer batch of the same peer replaced it
DUPLICATE = "duplicate"  # a round already offered by that peer
DECLINED = "declined"  # a peer our accept filter does not take (another mode, task or tokenizer)
EVENTS = (EVICTED, SUPERSEDED, DUPLICATE, DECLINED)
"""Intake events that are not a peer's fault (counted on their own)."""
