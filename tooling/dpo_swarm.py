"""Just enough of SwarmPeer for DPONode's exchange: a fixed membership whose parameter payloads a test chooses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace


class FakeDPOSwarm:
    """Members `peers` (ours is "me"); `serve(peer, round)` is what a fetch of that peer's round returns."""

    def __init__(self, arch_fp: str, peers: Sequence[str], serve: Callable[[str, int], bytes | None]) -> None:
        self.peer_id = "me"
        self.serve = serve
        self.members = [SimpleNamespace(peer_id=p, mode="dpo", arch_fp=arch_fp, round=0) for p in ("me", *peers)]

    def live_peers(self):
        return self.members

    def fetch(self, kind, peer, round_, deadline):
        return self.serve(peer, round_)

    def publish(self, kind, round_, payload):
        pass

    def set_round(self, round_):
        pass

    def stats(self):
        return {"bytes_in": 0, "bytes_out": 0}

    def close(self):
        pass
