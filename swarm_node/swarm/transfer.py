"""Blob streaming over hivemind P2P (libp2p streams through the node's p2pd), length-checked.

Wire format, both directions length-prefixed and never unpickled:
  request:  u16 length + JSON {"kind": str, "round": int} (exactly these keys; anything else is refused)
  response: 1 status byte (1 = found, 0 = not kept, 2 = busy: try again) [+ u64 length + 32-byte sha256 +
            body in chunks]
The receiver reads the length itself and refuses it before reading the body when it exceeds the limit
(`P2P.receive_raw_data` would trust the sender's header and buffer without bound).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hivemind.p2p import P2P, PeerID

from swarm_node.swarm import reasons

HANDLER = "swarm-node.blob.v1"
CHUNK = 2**20
MAX_REQUEST = 1024
MAX_KIND_CHARS = 32
FOUND, MISSING, BUSY = b"\x01", b"\x00", b"\x02"
BUSY_RETRY_S = 0.5
UPLOAD_REASONS = frozenset(reasons.UPLOAD_REASONS)
"""Refusals the blob handler counts (as `swarm:<reason>`); the set is fixed, so peers cannot grow it."""


class TransferError(Exception):
    """A download was refused or failed; `reason` is the counter name."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class BadRequest(Exception):
    """A peer's request broke the wire format; `reason` is one of UPLOAD_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class UploadLimits:
    """Bounds on what requesters can make this node hold while it serves blobs.

    A stalled reader holds an upload slot for at most `write_timeout_s` past the point where the socket
    buffers fill; slots are handed out first come, first served, so an honest request waits for about one
    deadline even when every slot is held by stallers. One identity holds at most `per_peer` streams.
    """

    max_uploads: int = 8
    per_peer: int = 2
    request_timeout_s: float = 10.0  # to receive the request after the stream opens
    slot_wait_s: float = 15.0  # for an upload slot, then answer BUSY
    write_timeout_s: float = 10.0  # for each chunk (1 MiB) to drain: at least ~100 KiB/s, else cut off


BlobLookup = Callable[[str, int], "tuple[bytes, bytes] | None"]
"""(kind, round) -> (payload, its sha256 digest) of a blob we keep, or None. The digest is the one stored
with the blob (`BlobStore.served`): hashing a payload of up to max_batch_bytes on the event loop for every
request would stall every stream handler of the node for as long."""
Refused = Callable[[str, str, str], None]  # (reason, peer id, detail)


def parse_request(raw: bytes, kinds: frozenset[str] | None = None) -> tuple[str, int]:
    """(kind, round) from a request body, or BadRequest: a JSON object with exactly these two keys."""
    try:
        req = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadRequest(reasons.BAD_REQUEST, f"not JSON ({type(exc).__name__})") from None
    if not isinstance(req, dict):
        raise BadRequest(reasons.BAD_REQUEST, f"request is a JSON {type(req).__name__}, not an object")
    if set(req) != {"kind", "round"}:
        raise BadRequest(reasons.BAD_REQUEST, f"request has keys {sorted(map(str, req))[:4]}, not kind and round")
    kind, round_ = req["kind"], req["round"]
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_KIND_CHARS or (kinds is not None and kind not in kinds):
        raise BadRequest(reasons.BAD_REQUEST, f"unknown kind {str(kind)[:MAX_KIND_CHARS]!r}")
    if isinstance(round_, bool) or not isinstance(round_, int) or not 0 <= round_ < 2**63:
        raise BadRequest(reasons.BAD_REQUEST, f"round is not an int in [0, 2**63): {str(round_)[:24]}")
    return kind, round_


async def _read_request(reader: asyncio.StreamReader, kinds, timeout: float) -> tuple[str, int]:
    try:
        head = await asyncio.wait_for(reader.readexactly(2), timeout)
        size = int.from_bytes(head, "big")
        if not 0 < size <= MAX_REQUEST:
            raise BadRequest(reasons.BAD_REQUEST, f"request length {size} not in 1..{MAX_REQUEST}")
        raw = await asyncio.wait_for(reader.readexactly(size), timeout)
    except asyncio.TimeoutError:
        raise BadRequest(reasons.REQUEST_TIMEOUT, f"no complete request within {timeout:.0f}s") from None
    return parse_request(raw, kinds)


async def _write(writer: asyncio.StreamWriter, data, timeout: float) -> None:
    writer.write(data)
    await asyncio.wait_for(writer.drain(), timeout)


def make_handler(lookup: BlobLookup, on_sent: Callable[[int], None], on_refused: Refused | None = None,
                 limits: UploadLimits = UploadLimits(), kinds: frozenset[str] | None = None):
    """Stream handler serving our kept blobs, with bounded slots, per-peer streams and write deadlines.

    Every refusal of a requester (junk request, too many streams, no slot, a stalled reader) goes to
    `on_refused(reason, peer_id, detail)`, which counts it and logs it rate-limited; nothing here raises.
    """
    uploads = asyncio.Semaphore(limits.max_uploads)
    streams: Counter[str] = Counter()
    refuse = on_refused or (lambda *_: None)

    async def handle(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(getattr(info, "peer_id", "?"))
        streams[peer] += 1
        try:
            if streams[peer] > limits.per_peer:
                refuse(reasons.UPLOAD_BUSY, peer, f"more than {limits.per_peer} open streams from this peer")
                await _write(writer, BUSY, limits.write_timeout_s)
                return
            kind, round_ = await _read_request(reader, kinds, limits.request_timeout_s)
            blob = lookup(kind, round_)
            if blob is None:
                await _write(writer, MISSING, limits.write_timeout_s)
                return
            payload, digest = blob
            try:
                await asyncio.wait_for(uploads.acquire(), limits.slot_wait_s)
            except asyncio.TimeoutError:
                refuse(reasons.UPLOAD_BUSY, peer, f"no upload slot free within {limits.slot_wait_s:.0f}s")
                await _write(writer, BUSY, limits.write_timeout_s)
                return
            try:
                await _write(writer, FOUND + len(payload).to_bytes(8, "big") + digest, limits.write_timeout_s)
                view = memoryview(payload)
                for off in range(0, len(view), CHUNK):
                    await _write(writer, view[off : off + CHUNK], limits.write_timeout_s)
            except asyncio.TimeoutError:
                refuse(reasons.UPLOAD_TIMEOUT, peer, f"{kind} round {round_}: a {CHUNK >> 20} MiB chunk did not drain "
                       f"within {limits.write_timeout_s:.0f}s; upload cut off")
                return
            finally:
                uploads.release()
            on_sent(len(payload))
        except BadRequest as exc:
            refuse(exc.reason, peer, exc.detail)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, OSError):
            pass  # the requester went away; nothing to serve
        finally:
            streams[peer] -= 1
            if streams[peer] <= 0:
                del streams[peer]
            writer.close()

    return handle


async def download(
    p2p: P2P,
    peer_id: str,
    kind: str,
    round_: int,
    *,
    expected_size: int,
    expected_sha256: str,
    max_bytes: int,
    on_received: Callable[[int], None],
    stall_s: float | None = None,
) -> bytes:
    """Fetch one blob; raises TransferError(reason) on any refusal. A busy server is asked again.

    `stall_s`: opening the stream, and each read after it, must get bytes within this long, else
    TransferError(stalled): a sender that never answers, or a stream that died silently, is cut off in
    seconds, whatever the size. The caller bounds the whole call (with_deadline), so retrying a busy server
    cannot outlive it.
    """
    while True:
        try:
            return await _download_once(p2p, peer_id, kind, round_, expected_size=expected_size,
                                        expected_sha256=expected_sha256, max_bytes=max_bytes, on_received=on_received,
                                        stall_s=stall_s)
        except TransferError as exc:
            if exc.reason != reasons.BUSY:
                raise
        await asyncio.sleep(BUSY_RETRY_S)


async def _download_once(
    p2p: P2P,
    peer_id: str,
    kind: str,
    round_: int,
    *,
    expected_size: int,
    expected_sha256: str,
    max_bytes: int,
    on_received: Callable[[int], None],
    stall_s: float | None = None,
) -> bytes:
    async def within(aw, what: str):
        try:
            return await asyncio.wait_for(aw, stall_s)
        except asyncio.TimeoutError:
            raise TransferError(reasons.STALLED, f"{what}: no byte for {stall_s:.1f}s") from None

    try:
        _info, reader, writer = await within(
            p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), HANDLER), "opening the stream")
    except TransferError:
        raise
    except Exception as exc:  # p2pd reports dial failures as P2PDaemonError / ControlFailure
        raise TransferError(reasons.STREAM_ERROR, f"cannot open stream: {exc}") from None
    try:
        req = json.dumps({"kind": kind, "round": round_}).encode()
        writer.write(len(req).to_bytes(2, "big") + req)
        await writer.drain()
        status = await within(reader.readexactly(1), "waiting for the answer")
        if status == BUSY:
            raise TransferError(reasons.BUSY, f"{peer_id[-8:]} has no upload slot free")
        if status != FOUND:
            raise TransferError(reasons.NOT_FOUND, f"{kind} round {round_} no longer kept")
        header = await within(reader.readexactly(8 + 32), "waiting for the header")
        length = int.from_bytes(header[:8], "big")
        if length > max_bytes:
            raise TransferError(reasons.TOO_LARGE, f"{length} bytes > limit {max_bytes}")
        if length != expected_size:
            raise TransferError(reasons.SIZE_MISMATCH, f"{length} bytes, announced {expected_size}")
        digest = hashlib.sha256()
        body = bytearray()
        while len(body) < length:
            part = await within(reader.read(min(CHUNK, length - len(body))), f"after {len(body)} of {length} bytes")
            if not part:
                raise asyncio.IncompleteReadError(bytes(body), length)
            on_received(len(part))
            digest.update(part)
            body += part
        if digest.hexdigest() != expected_sha256:
            raise TransferError(reasons.DIGEST_MISMATCH, f"sha256 {digest.hexdigest()[:12]}.. != announced {expected_sha256[:12]}..")
        return bytes(body)
    except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
        raise TransferError(reasons.STREAM_ERROR, f"{type(exc).__name__}: {exc}") from None
    finally:
        writer.close()


async def with_deadline(coro: Awaitable[bytes], timeout: float) -> bytes:
    try:
        return await asyncio.wait_for(coro, max(timeout, 0.0))
    except asyncio.TimeoutError:
        raise TransferError(reasons.TIMEOUT, f"no complete blob within {timeout:.1f}s") from None
