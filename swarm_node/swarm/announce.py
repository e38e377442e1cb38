"""Pushed batch announcements: one small message over a libp2p stream to a few random neighbours.

Wire format (never unpickled): u16 length + JSON object, at most MAX_ANNOUNCEMENT bytes:
  {"kind": "batch", "round": int, "version": int, "generated": float, "size": int, "sha256": hex,
   "mode": str, "model_name": str, "tokenizer_fp": str, "task_id": str}
The sender is the stream's remote peer id, which libp2p authenticates (TLS/Noise handshake with the
sender's key), so an announcement needs no signature of its own; the sha256 binds the payload to it.
The receiver answers nothing and closes the stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from hivemind.p2p import P2P, PeerID
from pydantic import BaseModel, ConfigDict, Field, ValidationError

HANDLER = "swarm-node.announce.v1"
MAX_ANNOUNCEMENT = 1024
READ_TIMEOUT_S = 5.0

_Str = Field(max_length=256)


class BatchAnnouncement(BaseModel):
    """What a sender says about a batch it serves (validated strictly: nothing is coerced)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: str = Field(pattern=r"^batch$")
    round: int = Field(ge=0, lt=2**63)
    version: int = Field(ge=0, lt=2**63)
    generated: float = Field(allow_inf_nan=False)
    size: int = Field(ge=0, lt=2**63)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    mode: str = _Str
    model_name: str = _Str
    tokenizer_fp: str = _Str
    task_id: str = _Str


def encode(ann: BatchAnnouncement) -> bytes:
    body = ann.model_dump_json().encode()
    if len(body) > MAX_ANNOUNCEMENT:
        raise ValueError(f"announcement of {len(body)} bytes exceeds {MAX_ANNOUNCEMENT}")
    return len(body).to_bytes(2, "big") + body


def decode(body: bytes) -> BatchAnnouncement:
    """Raises ValueError on anything but a valid announcement."""
    try:
        return BatchAnnouncement.model_validate(json.loads(body))
    except (ValidationError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc).splitlines()[0]) from None


def make_handler(on_announcement: Callable[[str, BatchAnnouncement | None, str, int], None]):
    """Stream handler; calls on_announcement(peer_id, announcement or None, problem, bytes read)."""

    async def handle(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_id = info.peer_id.to_base58()
        try:
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), READ_TIMEOUT_S), "big")
            if size > MAX_ANNOUNCEMENT:
                on_announcement(peer_id, None, f"announcement of {size} bytes > {MAX_ANNOUNCEMENT}", 2)
                return
            body = await asyncio.wait_for(reader.readexactly(size), READ_TIMEOUT_S)
            try:
                ann = decode(body)
            except ValueError as exc:
                on_announcement(peer_id, None, str(exc), 2 + size)
                return
            on_announcement(peer_id, ann, "", 2 + size)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, OSError):
            pass  # the sender went away mid-message; nothing was announced
        finally:
            writer.close()

    return handle


async def push(p2p: P2P, peer_id: str, frame: bytes, timeout: float) -> None:
    """Send one announcement; raises on failure (the caller counts it)."""

    async def send():
        _info, _reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), HANDLER)
        try:
            writer.write(frame)
            await writer.drain()
        finally:
            writer.close()

    await asyncio.wait_for(send(), timeout)
