"""What one swarm peer counts, and the one door its peer-caused log lines go through.

Every refusal of a peer's doing is counted by a name of `reasons.REJECTED` and logged through one
rate-limited log (`ratelimit.RateLimitedLog`, keyed by that name), so no peer can write log lines at the
rate it sends messages. Cumulative totals are what tools read (`stats`); a round reads the difference
since its previous read (`since_last`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from swarm_node.swarm import reasons
from swarm_node.swarm.intake import Intake
from swarm_node.swarm.ratelimit import RateLimitedLog

COUNTS = ("bytes_in", "bytes_out", "received", "served", "declined", "dht_restarts", "rejoins", "control_bytes_in",
          "control_bytes_out", "announcements_in", "announcements_out", "push_failed")
"""Byte and message counters (payload bytes in/out, DHT and announcement bytes in/out, pushes...)."""
ROUND_KEYS = ("bytes_in", "bytes_out", "control_bytes_in", "control_bytes_out", *reasons.EVENTS)
MAX_ONCE = 10_000  # refusals remembered for `once` (then forgotten all at once: memory stays bounded)


class SwarmCounters:
    """Counters of one swarm peer.

    Owns: the byte and message counters (COUNTS), refusals by reason (names of reasons.REJECTED only),
    payload refusals by the validator's own reasons, the once-per-record dedupe, and the rate-limited log of
    the lines a peer can cause.
    May call: ratelimit.RateLimitedLog, and reads Intake's own counts and size (`stats`); nothing else.
    Thread: any (one lock); `stats` and `since_last` return copies.
    """

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.peer_log = RateLimitedLog(log)  # lines a peer can cause: rate-limited per reason
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(COUNTS, 0)
        self._rejected: Counter = Counter()
        self._payload_refused: Counter = Counter()
        self._once: set[tuple] = set()
        self._last: dict | None = None

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def reject_records(self, key: str, problems: list[tuple[str, str, tuple]]) -> None:
        """Count the records.parse_signed problems of one DHT read of `key` (`bad_record`, one log per record)."""
        for owner, detail, once in problems:
            self.reject(reasons.BAD_RECORD, owner, f"{key}: {detail}", once=(key, *once))

    def reject(self, reason: str, peer_id: str, detail: str, *, once: tuple | None = None) -> None:
        """Count and log (rate-limited) a refusal of a peer's doing; `once` dedupes a bad DHT record that
        every poll reads again (counted and logged the first time only)."""
        if reason not in reasons.REJECTED:
            raise ValueError(f"{reason!r} is not a reason of swarm_node.swarm.reasons.REJECTED")
        with self._lock:
            if once is not None:
                if once in self._once:
                    return
                if len(self._once) >= MAX_ONCE:
                    self._once.clear()
                self._once.add(once)
            self._rejected[reason] += 1
        self.peer_log.warning(reason, "rejected from peer %s: %s (%s)", peer_id, reason, detail)

    def log_refusal(self, reason: str, peer_id: str, detail: str) -> None:
        """Log (rate-limited) a refusal counted elsewhere (the intake counts its own verdicts)."""
        self.peer_log.warning(reason, "rejected from peer %s: %s (%s)", peer_id, reason, detail)

    def add_rejected(self, counts: dict[str, int]) -> None:
        """Refusals counted and logged by another process (our DHT child's record refusals)."""
        with self._lock:
            self._rejected.update({r: n for r, n in counts.items() if r in reasons.REJECTED})

    def refuse_payload(self, reason: str, peer_id: str, round_: int, detail: str) -> None:
        """A downloaded batch the validator refused, under the validator's own reason (e.g. `protocol:*`)."""
        with self._lock:
            self._payload_refused[reason] += 1
        self.peer_log.warning(reason, "rejected batch round %d from %s: %s (%s)", round_, peer_id, reason, detail)

    def stats(self, intake: Intake) -> dict:
        """Cumulative counters, with the intake's refusals and events folded in."""
        counts = dict(intake.counts)
        with self._lock:
            rejected = dict(self._rejected)
            refused = dict(self._payload_refused)
            out: dict = dict(self._counts)
        for reason in reasons.OFFER_REASONS:
            if counts.get(reason):
                rejected[reason] = rejected.get(reason, 0) + counts[reason]
        out[reasons.DECLINED] += counts.get(reasons.DECLINED, 0)
        for ev in (reasons.EVICTED, reasons.SUPERSEDED, reasons.DUPLICATE):
            out[ev] = counts.get(ev, 0)
        return {**out, "rejected": rejected, "payload_refused": refused, "buffer": intake.snapshot()}

    def since_last(self, intake: Intake) -> dict:
        """Counters since the previous call: rejected and events by reason, payload and control bytes."""
        now = self.stats(intake)
        before = self._last or {"rejected": {}}
        self._last = now
        was = before["rejected"]
        rejected = {r: n - was.get(r, 0) for r, n in now["rejected"].items() if n > was.get(r, 0)}
        was = before.get("payload_refused", {})
        refused = {r: n - was.get(r, 0) for r, n in now["payload_refused"].items() if n > was.get(r, 0)}
        return {"rejected": rejected, "payload_refused": refused,
                **{k: now.get(k, 0) - before.get(k, 0) for k in ROUND_KEYS}}
