"""Blob streaming over hivemind P2P (libp2p streams through the node's p2pd), length-checked.

Wire format, both directions length-prefixed and never unpickled:
  request:  u16 length + JSON {"kind": str, "round": int}
  response: 1 status byte (1 = found, 0 = not kept) [+ u64 length + 32-byte sha256 + body in chunks]
The receiver reads the length itself and refuses it before reading the body when it exceeds the limit
(`P2P.receive_raw_data` would trust the sender's header and buffer without bound).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable

from hivemind.p2p import P2P, PeerID

HANDLER = "swarm-node.blob.v1"
CHUNK = 2**20
MAX_REQUEST = 1024
FOUND, MISSING = b"\x01", b"\x00"


class TransferError(Exception):
    """A download was refused or failed; `reason` is the counter name."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


BlobLookup = Callable[[str, int], "bytes | None"]


def make_handler(lookup: BlobLookup, on_sent: Callable[[int], None], max_uploads: int = 8):
    """Stream handler serving our kept blobs; one bounded set of concurrent uploads."""
    uploads = asyncio.Semaphore(max_uploads)

    async def handle(_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), 10.0), "big")
            if size > MAX_REQUEST:
                return
            req = json.loads(await asyncio.wait_for(reader.readexactly(size), 10.0))
            kind, round_ = req.get("kind"), req.get("round")
            if not isinstance(kind, str) or not isinstance(round_, int):
                return
            payload = lookup(kind, round_)
            if payload is None:
                writer.write(MISSING)
                await writer.drain()
                return
            async with uploads:
                writer.write(FOUND + len(payload).to_bytes(8, "big") + hashlib.sha256(payload).digest())
                view = memoryview(payload)
                for off in range(0, len(view), CHUNK):
                    writer.write(view[off : off + CHUNK])
                    await writer.drain()
            on_sent(len(payload))
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError, OSError):
            pass  # the requester went away or sent garbage; nothing to serve
        finally:
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
) -> bytes:
    """Fetch one blob; raises TransferError(reason) on any refusal."""
    try:
        _info, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), HANDLER)
    except Exception as exc:  # p2pd reports dial failures as P2PDaemonError / ControlFailure
        raise TransferError("stream_error", f"cannot open stream: {exc}") from None
    try:
        req = json.dumps({"kind": kind, "round": round_}).encode()
        writer.write(len(req).to_bytes(2, "big") + req)
        await writer.drain()
        status = await reader.readexactly(1)
        if status != FOUND:
            raise TransferError("not_found", f"{kind} round {round_} no longer kept")
        header = await reader.readexactly(8 + 32)
        length = int.from_bytes(header[:8], "big")
        if length > max_bytes:
            raise TransferError("too_large", f"{length} bytes > limit {max_bytes}")
        if length != expected_size:
            raise TransferError("size_mismatch", f"{length} bytes, announced {expected_size}")
        digest = hashlib.sha256()
        parts = []
        remaining = length
        while remaining:
            part = await reader.readexactly(min(CHUNK, remaining))
            remaining -= len(part)
            on_received(len(part))
            digest.update(part)
            parts.append(part)
        if digest.hexdigest() != expected_sha256:
            raise TransferError("digest_mismatch", f"sha256 {digest.hexdigest()[:12]}.. != announced {expected_sha256[:12]}..")
        return b"".join(parts)
    except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
        raise TransferError("stream_error", f"{type(exc).__name__}: {exc}") from None
    finally:
        writer.close()


async def with_deadline(coro: Awaitable[bytes], timeout: float) -> bytes:
    try:
        return await asyncio.wait_for(coro, max(timeout, 0.0))
    except asyncio.TimeoutError:
        raise TransferError("timeout", f"no complete blob within {timeout:.1f}s") from None
