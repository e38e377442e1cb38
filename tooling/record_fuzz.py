"""Fuzzing the DHT record validators (tests/test_fuzz.py and benchmarks/fuzz_decode.py).

Each case is a member record or announcement, mutated field by field (or replaced by any msgpack value),
stored under our swarm's key or another swarm's, signed by its owner, by someone else, or unsigned, and
run through what a DHT peer applies (hivemind's validators plus RecordGuard) and what a reader applies
(`parse_signed`). Neither may raise; a record both accept must keep the documented bounds.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import numpy as np
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.p2p import P2P
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import ValueWithExpiration

from swarm_node.swarm import records
from tooling.fuzzing import FuzzStats, Refused, pick, random_object, random_text, run_case

SWARM = "fz"


def _identity(directory: str, name: str):
    path = os.path.join(directory, name)
    P2P.generate_identity(path)
    key = records.load_identity_key(path)
    sub = records.subkey_for(key)
    return key, sub, records.peer_id_of_subkey(sub)


def _member(pid: str) -> dict:
    return dict(peer_id=pid, mode="grpo", model_name="m", tokenizer_fp="t", task_id="x", round=3,
                updated=time.time(), arch_fp="", client_mode=False, level=0)


def _announcement(pid: str, n: int) -> dict:
    return {"peer_id": pid, "updated": time.time(),
            "blobs": [{"round": i, "size": 100 + i, "sha256": f"{i:064x}"} for i in range(n)]}


def mutate_record(rng: np.random.Generator, rec: dict) -> tuple[object, str]:
    rec = dict(rec)
    op = int(rng.integers(0, 8))
    key = pick(rng, sorted(rec))
    if op == 0:
        return random_object(rng), "replace_all"
    if op == 1:
        rec.pop(key)
        return rec, f"drop:{key}"
    if op == 2:
        rec[key] = random_object(rng)
        return rec, f"replace:{key}"
    if op == 3:
        rec[random_text(rng, 6) or "x"] = random_object(rng)
        return rec, "extra_key"
    if op == 4:
        rec[key] = pick(rng, ["x" * 300, "", -1, 2**63, 1.5, True, None, b"raw", []])
        return rec, f"edge:{key}"
    if op == 5 and "blobs" in rec:
        blobs = [dict(b) for b in rec["blobs"]]
        if blobs:
            b = blobs[int(rng.integers(0, len(blobs)))]
            b[pick(rng, ["round", "size", "sha256"])] = pick(rng, [-1, "0" * 63, "G" * 64, 2**70, None, 1.0])
        rec["blobs"] = blobs if rng.integers(0, 2) else blobs * 10  # or over MAX_ANNOUNCED_ROUNDS
        return rec, "blobs"
    if op == 6:
        rec["peer_id"] = pick(rng, ["", "Qm" + "x" * 44, random_text(rng, 50)])
        return rec, "peer_id"
    return rec, "valid"


def _bounds(rec) -> list[str]:
    bad = []
    if isinstance(rec, records.MemberRecord):
        if rec.round < 0 or any(len(getattr(rec, f)) > 256 for f in ("peer_id", "mode", "model_name", "tokenizer_fp", "task_id")):
            bad.append("member out of bounds")
    elif isinstance(rec, records.Announcement):
        if len(rec.blobs) > records.MAX_ANNOUNCED_ROUNDS or any(b.round < 0 or b.size < 0 for b in rec.blobs):
            bad.append("announcement out of bounds")
    return bad


def _violations(result) -> list[str]:
    """The documented bounds, and the owner binding, of what both the DHT side and the reader accepted."""
    accepted, subkey, key_name = result
    bad = []
    for owner_id, rec in accepted.items():
        bad += _bounds(rec) + ([] if owner_id == rec.peer_id == records.peer_id_of_subkey(subkey) else ["owner"])
        if key_name.startswith(SWARM) and len(rec.model_dump_json()) > records.MAX_RECORD_BYTES:
            bad.append("too large")
    return bad


def run_records(n_cases: int, seed: int = 0) -> FuzzStats:
    """n_cases record mutations through the DHT-side validators and the reader; see the module docstring."""
    rng = np.random.default_rng(seed)
    stats = FuzzStats()
    with tempfile.TemporaryDirectory() as tmp:
        me, _my_sub, _ = _identity(tmp, "me")
        owner, owner_sub, owner_pid = _identity(tmp, "owner")
        _o2, other_sub, _ = _identity(tmp, "other")
        dht_side = CompositeValidator(records.make_validators(SWARM, me))
        signer = CompositeValidator([RSASignatureValidator(owner)])
        i = 0
        while stats.cases < n_cases:  # cases that cannot even be serialized are drawn again
            i += 1
            kind = pick(rng, ["members", "batch", "params"])
            base = _member(owner_pid) if kind == "members" else _announcement(owner_pid, int(rng.integers(0, 17)))
            value, what = mutate_record(rng, base)
            key_name = pick(rng, [f"{SWARM}_{kind}", f"other_{kind}", "unrelated"])
            subkey = pick(rng, [owner_sub, owner_sub, other_sub, b"unsigned", "str-subkey"])
            ttl = pick(rng, [60.0, 60.0, -5.0, 10 * records.MAX_RECORD_TTL_S])
            name = f"{what}@{key_name}"
            try:
                raw = MSGPackSerializer.dumps(value)
            except (OverflowError, TypeError, ValueError):  # not sendable at all (e.g. an int over 64 bits)
                continue

            def store_then_read(kind=kind, key_name=key_name, subkey=subkey, raw=raw, ttl=ttl, name=name):
                """What a DHT peer stores (or Refused), then what a reader makes of it (None: no record)."""
                record = DHTRecord(DHTID.generate(source=key_name).to_bytes(), MSGPackSerializer.dumps(subkey), raw,
                                   time.time() + ttl)
                if subkey is owner_sub or rng.integers(0, 4) == 0:  # the owner (or a forger reusing its subkey) signs
                    record = dataclasses.replace(record, value=signer.sign_value(record))
                if not dht_side.validate(record):
                    raise Refused("refused")
                readable = dht_side.strip_value(record)
                item = ValueWithExpiration(MSGPackSerializer.loads(readable), record.expiration_time)
                model = records.MemberRecord if kind == "members" else records.Announcement
                accepted, _problems = records.parse_signed({subkey: item}, model)
                return (accepted, subkey, key_name) if accepted else None

            run_case(stats, "record", name, len(raw), store_then_read, refusals=(Refused,), check=_violations)
            if i % 1000 == 0:
                records.REFUSALS.clear()
    return stats
