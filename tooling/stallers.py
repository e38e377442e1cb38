"""Identities that announce batches and never deliver them: the stalling announcer (test tooling).

Each staller is its own libp2p identity (a hivemind P2P with its own p2pd, so the victim sees N distinct
authenticated peers) that pushes batch announcements to its targets over the node's own announce
protocol and, when a target asks for the batch over the blob protocol, reads the request and then
`silent`: never answers, or `trickle`: answers "found" with the announced size and sends one byte a second.
A new identity costs nothing, so a node must not let such peers hold its download slots.

Everything runs on one asyncio loop (a SwarmPeer's LoopThread, or asyncio.run).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

from hivemind.p2p import P2P

from swarm_node.swarm import announce
from swarm_node.swarm.transfer import FOUND, HANDLER

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
HOLD_S = 3600.0
STARTUP_S = 60.0  # per p2pd: 64 of them start 8 at a time, on a loaded machine (hivemind waits 15 s)


class Stallers:
    """N stalling identities; `start` connects them to the targets, `announce` pushes one round's batch."""

    def __init__(self, n: int, mode: str = "silent", size: int = 200_000) -> None:
        if mode not in ("silent", "trickle"):
            raise ValueError(f"unknown staller mode {mode!r}")
        self.n, self.mode, self.size = n, mode, size
        self.p2ps: list[P2P] = []
        self.requests = 0  # blob requests the targets sent us (each a download slot held at the target)
        self.hung_up: list[float] = []  # seconds each held request lasted until its requester cut it off
        self.pushed = 0
        self._held: set[asyncio.Task] = set()

    async def start(self, target_maddrs: list[str], concurrency: int = 8) -> Stallers:
        gate = asyncio.Semaphore(concurrency)

        async def one() -> P2P:
            async with gate:
                p2p = await P2P.create(initial_peers=target_maddrs, host_maddrs=LOOPBACK,
                                       startup_timeout=STARTUP_S)
                await p2p.add_binary_stream_handler(HANDLER, self._serve)
                return p2p

        self.p2ps = list(await asyncio.gather(*(one() for _ in range(self.n))))
        return self

    async def _serve(self, _info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        task = asyncio.current_task()
        self._held.add(task)
        held_since = None
        try:
            size = int.from_bytes(await reader.readexactly(2), "big")
            await reader.readexactly(size)
            held_since = time.monotonic()
            if self.mode == "trickle":
                writer.write(FOUND + self.size.to_bytes(8, "big") + hashlib.sha256(b"never").digest())
                await writer.drain()
                while time.monotonic() < held_since + HOLD_S:
                    writer.write(b"x")
                    await writer.drain()
                    await asyncio.sleep(1.0)
            else:  # the requester sends nothing after its request: the read ends when it hangs up
                await asyncio.wait_for(reader.read(), HOLD_S)
                self.hung_up.append(time.monotonic() - held_since)
        except asyncio.TimeoutError:
            pass  # held for HOLD_S (TimeoutError is an OSError: caught before it)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            if held_since is not None:  # the requester cut the held stream off
                self.hung_up.append(time.monotonic() - held_since)
        except asyncio.CancelledError:
            pass  # close()
        finally:
            self._held.discard(task)
            writer.close()

    async def announce(self, targets: list[str], round_: int, *, mode: str, model_name: str, tokenizer_fp: str,
                       task_id: str, timeout_s: float = 5.0) -> int:
        """Every staller pushes an announcement of its batch for `round_` to every target -> pushes that got
        through."""
        ann = announce.BatchAnnouncement(
            kind="batch", round=round_, version=max(round_ - 1, 0), generated=time.time(), size=self.size,
            sha256=os.urandom(32).hex(), mode=mode, model_name=model_name, tokenizer_fp=tokenizer_fp,
            task_id=task_id)
        frame = announce.encode(ann)

        async def push(p2p: P2P, pid: str) -> bool:
            try:
                await announce.push(p2p, pid, frame, timeout_s)
                return True
            except Exception:
                return False

        done = await asyncio.gather(*(push(p, t) for p in self.p2ps for t in targets))
        self.pushed += sum(done)
        return sum(done)

    async def close(self) -> None:
        for task in list(self._held):
            task.cancel()
        await asyncio.gather(*(p.shutdown() for p in self.p2ps), return_exceptions=True)
        self.p2ps = []
