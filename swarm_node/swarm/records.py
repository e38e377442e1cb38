"""Signed DHT records: membership heartbeats and blob announcements.

Each record lives under a per-swarm key and a subkey that carries the owner's RSA public key, so
`RSASignatureValidator` lets only the owner overwrite it. `SchemaValidator` (pydantic v1, as hivemind
requires, with strict types so nothing is silently coerced) rejects malformed values at every DHT peer
that stores them. The owner's libp2p peer id is derived from the same public key, so a reader can tell
that a record claiming peer id X was really signed by X (`peer_id_of_subkey`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter

import multihash
import pydantic.v1 as pv1
from cryptography.hazmat.primitives import serialization
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer
from pydantic import BaseModel, ConfigDict, Field

from swarm_node.swarm import reasons
from swarm_node.swarm.ratelimit import RateLimitedLog
from swarm_node.swarm.sampling import MAX_LEVEL, shard_key, shard_of

KINDS = ("batch", "params")
"""Blob kinds that have an announcement key (rollout batches, DPO parameters)."""

MAX_ANNOUNCED_ROUNDS = 16


def members_key(swarm_id: str) -> str:
    return f"{swarm_id}_members"


def blobs_key(swarm_id: str, kind: str) -> str:
    return f"{swarm_id}_{kind}"


class MemberRecord(BaseModel):
    """A live peer, as seen through its latest heartbeat."""

    model_config = ConfigDict(extra="forbid")

    peer_id: str
    mode: str
    model_name: str
    tokenizer_fp: str
    task_id: str
    round: int = Field(ge=0)
    updated: float
    arch_fp: str = ""
    client_mode: bool = False
    level: int = Field(default=0, ge=0, le=MAX_LEVEL)  # the writer's shard level (sampled membership), 0 in full


class BlobEntry(BaseModel):
    """One announced blob: which round, how many bytes, and the sha256 hex digest of them."""

    model_config = ConfigDict(extra="forbid")

    round: int = Field(ge=0)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Announcement(BaseModel):
    """The blobs a peer serves for one kind (the last few rounds)."""

    model_config = ConfigDict(extra="forbid")

    peer_id: str
    updated: float
    blobs: list[BlobEntry]

    def entry(self, round: int) -> BlobEntry | None:
        return next((b for b in self.blobs if b.round == round), None)

    @property
    def latest(self) -> BlobEntry | None:
        return max(self.blobs, key=lambda b: b.round, default=None)


# ---- DHT-side schemas (pydantic v1, strict), checked by every DHT peer that stores a record ----

_Str = pv1.constr(strict=True, max_length=256)


class _MemberV1(pv1.BaseModel):
    peer_id: _Str
    mode: _Str
    model_name: _Str
    tokenizer_fp: _Str
    task_id: _Str
    round: pv1.conint(strict=True, ge=0)
    updated: pv1.StrictFloat
    arch_fp: _Str = ""
    client_mode: pv1.StrictBool = False
    level: pv1.conint(strict=True, ge=0, le=MAX_LEVEL) = 0

    class Config:
        extra = pv1.Extra.forbid


class _BlobV1(pv1.BaseModel):
    round: pv1.conint(strict=True, ge=0)
    size: pv1.conint(strict=True, ge=0)
    sha256: pv1.constr(strict=True, regex=r"^[0-9a-f]{64}$")

    class Config:
        extra = pv1.Extra.forbid


class _AnnouncementV1(pv1.BaseModel):
    peer_id: _Str
    updated: pv1.StrictFloat
    blobs: pv1.conlist(_BlobV1, max_items=MAX_ANNOUNCED_ROUNDS)

    class Config:
        extra = pv1.Extra.forbid


class _SwarmSchema(pv1.BaseModel):
    members: dict[BytesWithPublicKey, _MemberV1 | None]
    batch: dict[BytesWithPublicKey, _AnnouncementV1 | None]
    params: dict[BytesWithPublicKey, _AnnouncementV1 | None]


def make_validators(swarm_id: str | list[str], private_key: RSAPrivateKey | None = None) -> list:
    """Validators for one or more swarms: signatures (owner-only writes), record shapes under the swarms'
    own keys (which must be signed), the RecordGuard every swarm-node DHT peer applies to any key, and the
    ShardGuard on the swarms' shard keys. Hashes the swarms' shard keys here, before the DHT child forks, so
    the child inherits them and its event loop never stalls to build them (dht_bounds caps those keys)."""
    ids = [swarm_id] if isinstance(swarm_id, str) else list(swarm_id)
    register_shard_swarms(ids)
    shard_key_index()
    return [
        *(SchemaValidator(_SwarmSchema, allow_extra_keys=True, prefix=i) for i in ids),
        RSASignatureValidator(private_key),
        RecordGuard(),
        ShardGuard(ids),
    ]


# ---- rules for every record, whatever swarm its key belongs to ----
#
# DHT keys are hashed, so a peer cannot tell which swarm an unknown key belongs to; but every record a
# swarm-node peer signs carries an `[owner:...]` subkey. Signed records under *any* key must therefore be
# well-formed member records or announcements of their signer, and every record (signed or not, e.g.
# hivemind's averaging records) is bounded in size and lifetime. Storage is bounded per key and in total,
# and StoreRequests in keys and records, by swarm/dht_bounds.py, installed in each DHT child.

MAX_RECORD_BYTES = 4096  # value after its signature is stripped: a member record is ~300 B, 16 blobs ~1.6 KB
MAX_SUBKEY_BYTES = 1024  # an RSA-2048 owner subkey is ~400 B
MAX_RECORD_TTL_S = 86_400.0  # a record may not ask to be kept for more than a day
REFUSALS: Counter = Counter()  # in the DHT child process; read by dht.record_refusals()
_refusal_log = RateLimitedLog(logging.getLogger("swarm_node.dht"))


def refuse(reason: str, detail: str) -> bool:
    """Count and log (rate-limited) a refusal of the DHT child; False, what a validator or store returns."""
    REFUSALS[reason] += 1
    _refusal_log.warning(reason, "refused a DHT record: %s (%s)", reason, detail)
    return False


class RecordGuard(RecordValidatorBase):
    """Size and lifetime bounds on every record, and shape + signer checks on every signed record.

    Runs after RSASignatureValidator (lower priority), so it sees values with their signature stripped
    and only signatures that verified.
    """

    def validate(self, record: DHTRecord) -> bool:
        if len(record.value) > MAX_RECORD_BYTES or len(record.subkey) > MAX_SUBKEY_BYTES:
            return refuse(reasons.RECORD_TOO_LARGE, f"value {len(record.value)} B, subkey {len(record.subkey)} B")
        if record.expiration_time > time.time() + MAX_RECORD_TTL_S:
            return refuse(reasons.RECORD_TTL, f"expires {record.expiration_time - time.time():.0f}s from now")
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
        except Exception:
            return refuse(reasons.RECORD_SHAPE, "subkey is not msgpack")
        if not (isinstance(subkey, bytes) and RSASignatureValidator._PUBLIC_KEY_RE.search(subkey)):
            return True  # not a swarm-node record: only the bounds above apply
        try:
            value = MSGPackSerializer.loads(record.value)
        except Exception:
            return refuse(reasons.RECORD_SHAPE, "value is not msgpack")
        if value is None:
            return True  # a peer withdrawing its record
        rec = None
        for model in (_MemberV1, _AnnouncementV1):
            try:
                rec = model.parse_obj(value)
                break
            except (pv1.ValidationError, TypeError, ValueError):
                continue
        if rec is None:
            return refuse(reasons.RECORD_SHAPE, "signed value is neither a member record nor an announcement")
        if rec.peer_id != peer_id_of_subkey(subkey):
            return refuse(reasons.RECORD_OWNER, f"record claims peer {rec.peer_id[:16]}, signed by another key")
        return True


# ---- shard keys of sampled membership: `{swarm}_m{level}_{shard}` ----
#
# hivemind hands a validator (and the storage) only the key's DHTID, a hash, never the key's name: so the shard
# keys of the configured swarms are recognised by their hashes, all 2^(MAX_LEVEL+1) - 1 of them, computed once
# per process (0.4-0.9 s a swarm on a loaded 2-core machine; make_validators does it before the DHT child
# forks) and kept in a dict (~6 MB a swarm).

_shard_swarms: set[str] = set()
_shard_index: dict[int, tuple[str, int, int]] = {}  # DHTID (as int) -> (swarm id, level, shard)
_indexed: set[str] = set()


def register_shard_swarms(swarm_ids: list[str] | tuple[str, ...] | set[str]) -> None:
    """Make the shard keys of these swarms known to ShardGuard and dht_bounds in this process (and any child
    it forks after this call). Cheap: the hashes are computed on first use."""
    _shard_swarms.update(swarm_ids)


def shard_key_index() -> dict[int, tuple[str, int, int]]:
    """DHTID (as int) -> (swarm id, level, shard) of every shard key of the registered swarms."""
    for swarm in _shard_swarms - _indexed:
        for level in range(MAX_LEVEL + 1):
            for shard in range(2**level):
                _shard_index[int(DHTID.generate(source=shard_key(swarm, level, shard)))] = (swarm, level, shard)
        _indexed.add(swarm)
    return _shard_index


def shard_of_key(key_id: int) -> tuple[str, int, int] | None:
    """(swarm id, level, shard) if this DHTID is a shard key of a registered swarm, else None."""
    return shard_key_index().get(int(key_id)) if _shard_swarms else None


class ShardGuard(RecordValidatorBase):
    """Under a shard key of the configured swarms: only signed member records of their signer, whose signer
    belongs to that shard (`shard_of(peer_id, level)`) and whose recorded level is within one of the key's.

    Why: a shard key holds at most SHARD_SUBKEYS entries (dht_bounds), so unsigned junk or another swarm's
    records could otherwise fill it; and an attacker must grind RSA keys to place an identity in a given shard
    (about 2^level key generations each). Runs after RSASignatureValidator, like RecordGuard."""

    def __init__(self, swarm_ids: list[str] | tuple[str, ...]) -> None:
        self.swarm_ids = tuple(swarm_ids)

    def validate(self, record: DHTRecord) -> bool:
        register_shard_swarms(self.swarm_ids)  # also in a child that unpickled us instead of forking
        where = shard_of_key(int.from_bytes(record.key, "big"))
        if where is None or where[0] not in self.swarm_ids:  # the registry is per process; we guard our swarms
            return True
        _swarm, level, shard = where
        try:
            subkey = MSGPackSerializer.loads(record.subkey)
            value = MSGPackSerializer.loads(record.value)
        except Exception:
            return refuse(reasons.RECORD_SHAPE, "a shard record that is not msgpack")
        owner = peer_id_of_subkey(subkey)
        if owner is None:
            return refuse(reasons.RECORD_SHAPE, "an unsigned record under a shard key")
        if value is None:
            return True  # a peer withdrawing its record
        try:
            rec = _MemberV1.parse_obj(value)
        except (pv1.ValidationError, TypeError, ValueError):
            return refuse(reasons.RECORD_SHAPE, "a shard record that is not a member record")
        if rec.peer_id != owner:
            return refuse(reasons.RECORD_OWNER, f"shard record claims peer {rec.peer_id[:16]}, signed by another key")
        if shard_of(owner, level) != shard or abs(rec.level - level) > 1:
            return refuse(reasons.RECORD_OWNER, f"peer {owner[:16]} at level {rec.level} does not write to "
                          f"shard {shard} of level {level}")
        return True


# ---- identities ----


def load_identity_key(identity_path: str) -> RSAPrivateKey:
    """The RSA key inside a libp2p identity file: it signs our records and defines our peer id."""
    with open(identity_path, "rb") as f:
        der = crypto_pb2.PrivateKey.FromString(f.read()).data
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": der})
    return key


def subkey_for(private_key: RSAPrivateKey) -> bytes:
    return RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", private_key.get_public_key().to_bytes())


def peer_id_of_subkey(subkey: bytes) -> str | None:
    """libp2p peer id (base58) of the RSA key in an `[owner:...]` subkey; None if there is none."""
    found = RSASignatureValidator._PUBLIC_KEY_RE.findall(subkey) if isinstance(subkey, bytes) else []
    if len(found) != 1:
        return None
    try:
        public_key = serialization.load_ssh_public_key(found[0])
        der = public_key.public_bytes(
            encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
        )
    except (ValueError, TypeError):
        return None
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    digest = multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))
    return PeerID(digest).to_base58()


def own_member_record(peer_id: str, info, round: int, client_mode: bool, level: int = 0) -> MemberRecord:
    """The member record a node publishes, in either membership (`info`: the node's swarm.PeerInfo)."""
    return MemberRecord(
        peer_id=peer_id, mode=info.mode, model_name=info.model_name, tokenizer_fp=info.tokenizer_fp,
        task_id=info.task_id, round=round, updated=float(time.time()), arch_fp=info.arch_fp,
        client_mode=client_mode, level=level,
    )


def parse_signed(value, model) -> tuple[dict, list[tuple[str, str, tuple]]]:
    """Records of a dictionary DHT value, keyed by the peer id of the key that signed each one.

    Returns (records, problems); a problem is (peer id, detail, dedupe key). Entries set to None are
    peers that left. A record whose `peer_id` differs from its signer's is a problem, not a record.
    """
    out: dict = {}
    problems: list[tuple[str, str, tuple]] = []
    if not isinstance(value, dict):
        return out, problems
    for subkey, item in value.items():
        raw = getattr(item, "value", None)
        if raw is None:
            continue
        owner = peer_id_of_subkey(subkey)
        try:
            rec = model.model_validate(raw)
        except ValueError as exc:
            problems.append((owner or "?", f"invalid record: {str(exc).splitlines()[0]}", (owner, str(raw)[:64])))
            continue
        if owner is None or rec.peer_id != owner:
            problems.append((owner or "?", f"record claims peer {rec.peer_id}", (owner, rec.peer_id)))
            continue
        out[owner] = rec
    return out, problems
