"""A misbehaving swarm peer, for tests and benchmarks/attack.py (a test helper, not a product feature).

It is a real process that joins a real hivemind swarm through the node's own swarm stack (SwarmPeer:
DHT child, p2pd, signed records, pushes and the blob handler) and builds its batches with the project's
own encoders from samples of a real tiny model (a GRPONode with the swarm disabled), corrupting only what
each attack needs. It follows the honest peers' round and runs its modes one after another, each for
`--rounds-per-mode` honest rounds, with a quiet gap between modes; it writes what it did to `--out`
(JSON: its peer id, and per mode the unix times it ran), so a reader can attribute an honest node's
rejections to the attack that caused them.

    python tooling/adversary.py --model-dir DIR --maddr MADDR --swarm-id S --out F [--modes a,b] [...]

MODES maps each mode to the reasons an honest GRPO node must count for it (`rejected` keys of its
metrics rows; "rewards_overridden" is the row's own count). A few are expected to cost nothing visible:
a request that is never read does not hold an upload slot while a whole batch fits the socket buffers
(tiny models' batches do; tests/test_hostile_transfer.py stalls a 4 MiB blob), and a forged write under
another peer's subkey is refused by every storer's signature check before our validators see it.

Why one module of ~760 lines: it is the catalogue of attack modes (one short function each, chosen by
name on the command line) around one process's join-and-follow loop; split by mode, every file would
repeat that loop's set-up, and a reader looks for "what does mode X send" in one place.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

MODES: dict[str, tuple[str, ...]] = {
    # what a batch says
    "false_rewards": ("rewards_overridden",),
    "nan_rewards": ("protocol:reward_not_finite",),
    "extreme_logprobs": ("logprob_outlier",),
    "ids_over_vocab": ("protocol:id_out_of_range",),
    "length_mismatch": ("protocol:",),  # whichever count check sees it first
    "wrong_tokenizer": ("tokenizer_mismatch",),
    "wrong_task": ("task_mismatch",),
    "fabricate_positive": ("logprob_skew",),
    "fabricate_all": ("logprob_outlier",),
    # how big or costly it is
    "oversize": ("swarm:too_large",),
    "zstd_bomb": ("protocol:decompressed_too_large",),
    "msgpack_bomb": ("protocol:msgpack_limit",),
    "empty_planes": ("protocol:missing_planes",),
    "long_completions": ("token_capped",),  # maximal-length, mixed right and wrong, honest log-probs
    # when it was made, and by whom
    "stale": ("swarm:stale_age",),
    "future": ("swarm:future_round",),
    "replay_verbatim": ("replayed_group",),
    "replay_reencoded": ("replayed_group",),
    # the network
    "flood": ("swarm:future_round",),
    "sybil": ("newcomer_capped",),
    "overwrite_records": ("swarm:record_owner",),
    "wrong_digest": ("swarm:digest_mismatch",),
    "stall": (),
    "junk_requests": ("swarm:bad_request",),
    # --stallers identities announce batches and never answer (tooling/stallers.py): their downloads
    # are cut off after download_stall_s without a byte and counted, and never hold an established peer's slot
    "stall_announce": ("swarm:stalled",),
    # 4 MiB StoreRequests (~110k records, tooling/dht_flood.py) at the honest node's DHT child
    "dht_flood": ("swarm:store_too_large",),
}
BATCH_MODES = ("false_rewards", "nan_rewards", "extreme_logprobs", "ids_over_vocab", "length_mismatch",
               "wrong_tokenizer", "wrong_task", "fabricate_positive", "fabricate_all", "zstd_bomb", "msgpack_bomb",
               "empty_planes", "stale", "future", "replay_verbatim", "replay_reencoded", "wrong_digest",
               "long_completions")
# the skew audit needs a few batches of mixed groups per peer; a stalled download is counted at its deadline
MIN_ROUNDS = {"fabricate_positive": 4, "sybil": 3, "stall_announce": 4, "dht_flood": 2}
MIN_SECONDS = {"stall_announce": 8.0}  # past the first announcement: stalled downloads are cut off (5 s)
# announced by each staller. A download's whole deadline is download_stall_s + size / download_min_rate (capped
# at collect_deadline_s): 5 + 200 kB / 64 KiB/s = 8 s for the honest node (its batch cap is ~250 kB), so a
# silent staller's stall cut-off (5 s after its stream opened) comes 3 s before the deadline, however long the
# open takes under load. At 20 kB it came 0.3 s before, and a slower open let the deadline count `timeout`.
STALLER_BYTES = 200_000
FLOOD_S = 3.0  # seconds of StoreRequests per honest round of dht_flood
FABRICATE_DELTA = 1.0  # nats taken off the claimed log-probs (exp(1) = 2.7x: the F-TIS cap's full 2x)

log = logging.getLogger("adversary")


# ---- batches: real samples, the project's encoders, one corruption each ----


class Forge:
    """Makes the batches: samples of a real tiny model plus each group's right answer, claimed log-probs
    computed by the same model (so a clean batch passes every check), then corrupted per mode."""

    def __init__(self, model_dir: str, swarm_id: str, seed: int, prompts: int, state_dir: Path) -> None:
        import torch

        from swarm_node.config import NodeConfig
        from swarm_node.grpo.round import GRPONode

        torch.set_num_threads(1)
        cfg = NodeConfig.model_validate({
            "seed": seed, "model": {"path": model_dir}, "swarm": {"enabled": False, "swarm_id": swarm_id},
            "task": {"name": "arithmetic", "prompts_per_round": prompts, "eval_n": 8},
            "generation": {"num_generations": 8, "max_new_tokens": 6},  # as peers/tiny-s.yaml
        })
        self.node = GRPONode(cfg, state_dir)
        self.swarm_id = swarm_id

    def groups(self, r: int, salt: int = 0):
        """TrainGroups of round r: sampled completions plus the right answer; honest log-probs; recomputed rewards."""
        from swarm_node.training.groups import TrainGroup

        n = self.node
        local = n.generate(r * 7919 + salt)
        out = []
        for p, pids, ss in zip(local.prompts, local.prompt_ids, local.samples, strict=True):
            comps = [np.asarray(s.token_ids) for s in ss]
            answer = n.tok(p.answer, add_special_tokens=False)["input_ids"] + [n.tok.eos_token_id]
            comps[0] = np.asarray(answer)  # one right answer per group, so advantages are mixed
            g = TrainGroup(prompt_ids=np.asarray(pids), completions=comps,
                           behaviour_logprobs=[np.zeros(len(c), np.float32) for c in comps],
                           rewards=np.zeros(len(comps), np.float32), source="adversary")
            out.append((p, g))
        lps = n.trainer.completion_logprobs([g for _p, g in out])
        for (p, g), lp in zip(out, lps, strict=True):
            g.behaviour_logprobs = [np.minimum(np.asarray(x, np.float32), 0.0) for x in lp]
            g.rewards = np.array([n.task.reward(p, n.tok.decode(c.tolist(), skip_special_tokens=True))
                                  for c in g.completions], np.float32)
        return out

    def batch(self, r: int, *, salt: int = 0, delta: float = 0.0, everywhere: bool = False, invert: bool = False,
              task_id: str | None = None, tokenizer_fp: str | None = None, model_name: str = "adversary"):
        from swarm_node.protocol import Completion, Group, RolloutBatch

        n = self.node
        groups = []
        for p, g in self.groups(r, salt):
            rew = np.asarray(g.rewards, np.float64)
            comps = []
            for c, b, rw in zip(g.completions, g.behaviour_logprobs, rew, strict=True):
                lower = delta if delta and (everywhere or rw > rew.mean() + 1e-9) else 0.0
                comps.append(Completion(c, np.asarray(b, np.float64) - lower, float(1.0 - rw if invert else rw)))
            groups.append(Group(prompt_id=p.id, prompt_ids=g.prompt_ids, completions=comps))
        return RolloutBatch(swarm_id=self.swarm_id, task_id=task_id or n.task.task_id,
                            tokenizer_fp=tokenizer_fp or n.loaded.tokenizer_fp, model_name=model_name, round=r,
                            vocab_size=n.loaded.vocab_size, groups=groups)

    def long_batch(self, r: int):
        """The most compute a batch within the receiver's limits can cost it (grpo/limits.py ROOM x its own
        round in each dimension; the receiver is assumed to run tiny-s's settings, as ours): every group G x
        ROOM completions of max_new_tokens x ROOM tokens, half the right answer and half a wrong one, padded
        with spaces (which the reward strips), with the model's own log-probs. Every check passes; only the
        token budget (admission.max_tokens_per_peer) stops it."""
        from swarm_node.grpo.limits import ROOM
        from swarm_node.protocol import Completion, Group, RolloutBatch
        from swarm_node.training.groups import TrainGroup

        n = self.node
        length, per_group = ROOM * n.cfg.generation.max_new_tokens, ROOM * n.cfg.generation.num_generations
        space = n.tok(" ", add_special_tokens=False)["input_ids"][:1]

        def padded(text: str) -> np.ndarray:
            ids = n.tok(text, add_special_tokens=False)["input_ids"][:length]
            return np.asarray(ids + space * (length - len(ids)))

        made = []
        for p, g in self.groups(r):
            wrong = str(int(p.answer) + 1)
            comps = [padded(p.answer if i % 2 == 0 else wrong) for i in range(per_group)]
            made.append((p, TrainGroup(prompt_ids=g.prompt_ids, completions=comps,
                                       behaviour_logprobs=[np.zeros(length, np.float32)] * per_group,
                                       rewards=np.zeros(per_group, np.float32), source="adversary")))
        lps = n.trainer.completion_logprobs([g for _p, g in made])
        groups = []
        for (p, g), lp in zip(made, lps, strict=True):
            comps = [Completion(c, np.minimum(np.asarray(x, np.float64), 0.0),
                                n.task.reward(p, n.tok.decode(c.tolist(), skip_special_tokens=True)))
                     for c, x in zip(g.completions, lp, strict=True)]
            groups.append(Group(prompt_id=p.id, prompt_ids=g.prompt_ids, completions=comps))
        return RolloutBatch(swarm_id=self.swarm_id, task_id=n.task.task_id, tokenizer_fp=n.loaded.tokenizer_fp,
                            model_name="adversary", round=r, vocab_size=n.loaded.vocab_size, groups=groups)

    def payload(self, mode: str, r: int) -> bytes:
        from swarm_node.protocol import columns as col
        from swarm_node.protocol import encode_batch
        from swarm_node.protocol.codec import LQ_ESCAPE, batch_to_body, pack_body
        from swarm_node.protocol.framing import frame
        from tooling.batch_fuzz import empty_planes_bomb, nested_arrays_bomb, zeros_bomb

        if mode == "zstd_bomb":
            return zeros_bomb(256 << 20)
        if mode == "msgpack_bomb":
            return nested_arrays_bomb(100_000)  # 100k empty arrays in 100 kB (under the body cap: msgpack limits)
        if mode == "empty_planes":
            return empty_planes_bomb(n_groups=4, per_group=8, tokens=16)  # counts within the receive limits
        if mode == "false_rewards":
            return encode_batch(self.batch(r, invert=True))
        if mode == "wrong_tokenizer":
            return encode_batch(self.batch(r, tokenizer_fp="not-" + self.node.loaded.tokenizer_fp[:16]))
        if mode == "wrong_task":
            return encode_batch(self.batch(r, task_id="gsm8k"))
        if mode == "fabricate_positive":
            return encode_batch(self.batch(r, delta=FABRICATE_DELTA))
        if mode == "fabricate_all":
            return encode_batch(self.batch(r, delta=FABRICATE_DELTA, everywhere=True))
        if mode == "long_completions":
            return encode_batch(self.long_batch(r))
        body = batch_to_body(self.batch(r))
        if mode == "nan_rewards":  # the reward table's largest entry becomes NaN (its bits stay the largest)
            rv = np.frombuffer(body["rv"], "<f8").copy()
            rv[-1] = np.nan
            body["rv"] = rv.tobytes()
        elif mode == "extreme_logprobs":  # NaN/inf/positive cannot be written on the wire: the most negative
            n_q = _count(body["lq"])  # every log-prob escaped to 2**24 - 1 ticks: log q = -262,144
            body["lq"] = list(col.to_planes(np.full(n_q, LQ_ESCAPE, np.int64)))
            body["lx"] = list(col.to_planes(np.full(n_q, (1 << 24) - 1 - LQ_ESCAPE, np.int64)))
        elif mode == "ids_over_vocab":
            body["vocab"] = _max_id(body)  # the largest id is then out of range
        elif mode == "length_mismatch":
            k, planes = body["cl"]
            lens = np.frombuffer(planes, np.uint8).reshape(k, -1).copy() if k else None
            if lens is not None:
                lens[0, 0] = (int(lens[0, 0]) + 1) % 256
                body["cl"] = [k, lens.tobytes()]
        else:
            return encode_batch(self.batch(r))  # a clean batch (stale, future, wrong_digest, sybil...)
        return frame(pack_body(body))


def _count(planes: list) -> int:
    k, data = planes
    return len(data) // k if k else 0


def _max_id(body: dict) -> int:
    from swarm_node.protocol import decode_batch
    from swarm_node.protocol.codec import pack_body
    from swarm_node.protocol.framing import frame

    b = decode_batch(frame(pack_body(body)))
    ids = [int(np.max(c.token_ids)) for g in b.groups for c in g.completions if len(c.token_ids)]
    return max(ids)  # the largest id itself as the vocab size: that id is then out of range


# ---- the network side ----


async def _send_raw(p2p, peer: str, frame: bytes, read: bool = True) -> None:
    from hivemind.p2p import PeerID

    from swarm_node.swarm.transfer import HANDLER

    _info, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer), HANDLER)
    writer.write(frame)
    await writer.drain()
    if read:
        try:
            await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
    else:
        return writer


JUNK = [b"[]", b"null", b"1", b'"a"', b"{}", b'{"kind": "batch", "round": -1}', b"\xff\xfe", b"[" * 1000]


class Adversary:
    def __init__(self, args) -> None:
        from swarm_node.config import SwarmConfig
        from swarm_node.swarm import PeerInfo, SwarmPeer, keep_raw

        self.args = args
        self.forge = Forge(args.model_dir, args.swarm_id, args.seed, args.prompts, Path(args.state_dir))
        n = self.forge.node
        self.cfg = SwarmConfig(enabled=True, swarm_id=args.swarm_id, initial_peers=[args.maddr],
                               host_maddrs=["/ip4/127.0.0.1/tcp/0"], heartbeat_s=1.0, record_ttl_s=8.0,
                               max_batch_bytes=256 << 20)
        self.info = PeerInfo(mode="grpo", model_name="adversary", tokenizer_fp=n.loaded.tokenizer_fp,
                             task_id=n.task.task_id)
        self.node = SwarmPeer(self.cfg, self.info, validate=keep_raw).start()  # replays take honest bytes
        self.sybils: list = []
        self.stallers = None  # tooling/stallers.Stallers while stall_announce runs
        self.newest = 0  # newest round we announced a batch for
        self._honest: dict[str, int] = {}
        self._honest_at = -1e9
        self.report: dict = {"peer_id": self.node.peer_id, "modes": {}}

    # -- helpers --

    def honest(self) -> dict[str, int]:
        """Honest peers' rounds from their membership records, read at most once a second (each read asks
        every DHT node near the key: polling faster would load the honest node's DHT, not test it)."""
        now = time.monotonic()
        if now - self._honest_at >= 1.0:
            self._honest = {m.peer_id: m.round for m in self.node.live_peers()
                            if m.peer_id != self.node.peer_id and m.model_name not in ("adversary", "sybil")}
            # membership records are re-stored a few times per TTL, while a fast honest node keeps only its
            # last few rounds' batches: the newest round its pushes offered us is the one still fetchable
            pushed = self.node.intake.newest_rounds()
            for pid in self._honest:
                self._honest[pid] = max(self._honest[pid], pushed.get(pid, -1))
            self._honest_at = now
        return self._honest

    def honest_round(self) -> int:
        return max(self.honest().values(), default=0)

    def run_on_loop(self, coro, timeout: float = 30.0):
        return self.node.loop.run(coro, timeout)

    def save(self) -> None:
        tmp = Path(self.args.out + ".tmp")
        tmp.write_text(json.dumps(self.report))
        os.replace(tmp, self.args.out)

    # -- one honest round of one mode --

    def publish_once(self, r: int, payload: bytes, **kw) -> None:
        """Publish a batch meant to be refused, then withdraw it: otherwise it stays our newest announcement
        and every later heartbeat re-pushes it, so its refusals would be counted in the next modes' windows
        and the next modes' batches would not be the ones offered."""
        node = self.node
        before = node.view.latest
        node.publish("batch", r, payload, **kw)
        time.sleep(0.5)  # the push is on its way
        node.blobs.drop("batch", r)
        node.view.latest = before

    def act(self, mode: str, r: int) -> bool:
        """One attack for the honest round r - 1 -> r; False if it could not be launched this time."""
        node = self.node
        r = max(r, self.newest + 1)  # an announcement at or below our newest round is a mere duplicate
        if mode in BATCH_MODES and mode not in ("replay_verbatim", "replay_reencoded", "future", "stale",
                                                  "wrong_digest"):
            node.set_round(r)
            node.publish("batch", r, self.forge.payload(mode, r))
            self.newest = r
        elif mode == "stale":  # generated an hour ago (the age limit is 120 s); refused before it counts
            self.publish_once(r, self.forge.payload(mode, r), generated=time.time() - 3600)
        elif mode == "future":  # a round 10**12 ahead of what its membership says; refused before it counts
            self.publish_once(10**12 + r, self.forge.payload(mode, r), version=r)
        elif mode == "oversize":  # a payload over the receiver's max_batch_bytes (the runner sets it to 1 MiB)
            node.set_round(r)
            node.publish("batch", r, os.urandom(self.args.oversize_bytes))
            self.newest = r
        elif mode in ("replay_verbatim", "replay_reencoded"):
            honest = self.honest()
            # an honest batch pushed to us (a fast node keeps only its last few rounds, so fetching the
            # round a membership record names often finds it gone); else fetch by record
            got = [b for b in self.node.receive(8).batches if b.peer_id in honest and b.round > self.newest]
            candidates = [(b.peer_id, b.round, b.payload) for b in sorted(got, key=lambda b: -b.round)]
            candidates += [(pid, pr, None) for pid, pr in honest.items()]
            for pid, pr, data in candidates:
                if mode == "replay_verbatim" and pr <= self.newest:
                    return False  # the same bytes must carry their own round: wait for a newer one
                if data is None:
                    data = node.fetch("batch", pid, pr, deadline_s=5.0)
                if data is None and mode == "replay_reencoded" and getattr(self, "_stolen", None):
                    data = self._stolen  # the honest record names a round its owner no longer keeps: reuse
                if data is None:  # the batch replay_verbatim took (re-encoding it is this mode's attack)
                    return False
                if mode == "replay_verbatim":
                    self._stolen = data
                if mode == "replay_reencoded":  # decoded and re-encoded under our name, for our round
                    from swarm_node.protocol import decode_batch, encode_batch

                    b = decode_batch(data)
                    b.model_name, b.round = "adversary", r
                    data, pr = encode_batch(b), r
                node.set_round(pr)
                node.publish("batch", pr, data)
                self.newest = pr
                return True
            return False
        elif mode == "wrong_digest":  # announce one payload, then serve other bytes of the same size
            node.set_round(r)
            good = self.forge.payload(mode, r)
            node.publish("batch", r, good)
            self.newest = r
            announced = next(e for e in node.blobs.entries("batch") if e.round == r)
            node.blobs.put("batch", announced, bytes(reversed(good)))  # same entry, other bytes
        elif mode == "flood":  # announcements far ahead, many per second
            from swarm_node.swarm import announce

            async def flood():
                for pid in self.honest():
                    for i in range(50):
                        ann = announce.BatchAnnouncement(kind="batch", round=r + 5000 * (i + 1), version=r, generated=time.time(),
                                                  size=1000, sha256="0" * 64, mode="grpo", model_name="adversary",
                                                  tokenizer_fp=self.info.tokenizer_fp, task_id=self.info.task_id)
                        try:
                            await announce.push(node.dht.p2p, pid, announce.encode(ann), 5.0)
                        except Exception as exc:
                            log.info("flood push: %s", exc)
            self.run_on_loop(flood())
        elif mode == "sybil":
            from swarm_node.protocol import encode_batch

            self.start_sybils()
            # fresh identities claim fresh rounds (1, 2, ...): a round far past what their own signed
            # record says would be refused as future_round before the newcomer gate is reached
            self._sybil_round = getattr(self, "_sybil_round", 0) + 1
            payloads = []
            for i in range(len(self.sybils)):
                b = self.forge.batch(r, salt=101 + i, model_name="sybil")  # this round's prompts
                b.round = self._sybil_round
                payloads.append(encode_batch(b))
            for s, data in zip(self.sybils, payloads, strict=True):  # all at once: they compete for one round
                s.set_round(self._sybil_round)
                s.publish("batch", self._sybil_round, data)
        elif mode == "overwrite_records":
            from swarm_node.swarm import records

            for pid in self.honest():  # a record signed by us that names the honest peer, under the members key
                fake = dict(peer_id=pid, mode="grpo", model_name="x", tokenizer_fp=self.info.tokenizer_fp,
                            task_id=self.info.task_id, round=10**9, updated=time.time(), arch_fp="",
                            client_mode=False, level=0)
                try:
                    node.dht.call("store", records.members_key(self.args.swarm_id), fake, time.time() + 30,
                                  subkey=node.dht.subkey)
                except Exception as exc:
                    log.info("store: %s", exc)
        elif mode == "stall":  # ask for the honest peers' blobs and never read (streams held until the mode ends)
            async def stall():
                held = []
                for pid, pr in self.honest().items():
                    q = json.dumps({"kind": "batch", "round": pr}).encode()
                    for _ in range(4):
                        try:
                            held.append(await _send_raw(node.dht.p2p, pid, len(q).to_bytes(2, "big") + q, read=False))
                        except Exception as exc:
                            log.info("stall: %s", exc)
                return held
            self._held = getattr(self, "_held", []) + (self.run_on_loop(stall()) or [])
        elif mode == "stall_announce":
            self.prepare(mode)
            self._stall_round = getattr(self, "_stall_round", 0) + 1
            pushed = self.run_on_loop(self.stallers.announce(
                list(self.honest()), self._stall_round, mode="grpo", model_name="staller",
                tokenizer_fp=self.info.tokenizer_fp, task_id=self.info.task_id), timeout=60)
            log.info("stallers announced round %d: %d pushes got through; %d requests held so far",
                     self._stall_round, pushed, self.stallers.requests)
        elif mode == "dht_flood":
            import functools

            from hivemind.p2p import PeerID

            from tooling.dht_flood import _flood

            for pid in self.honest():
                counts = node.dht.call("run_coroutine", functools.partial(
                    _flood, PeerID.from_base58(pid).to_bytes(), "plain", 2, FLOOD_S))
                log.info("dht_flood at %s: %s", pid, counts)
        elif mode == "junk_requests":
            async def junk():
                for pid in self.honest():
                    for j in JUNK:
                        try:
                            await _send_raw(node.dht.p2p, pid, len(j).to_bytes(2, "big") + j)
                        except Exception as exc:
                            log.info("junk: %s", exc)
            self.run_on_loop(junk(), timeout=60)
        return True

    def prepare(self, mode: str) -> None:
        """What a mode needs before its clock starts: stall_announce's identities (64 p2pd take ~40 s)."""
        if mode == "stall_announce" and self.stallers is None:
            t0 = time.monotonic()
            self.stallers = self.run_on_loop(self.start_stallers(), timeout=300)
            log.info("%d stallers started in %.1fs", len(self.stallers.p2ps), time.monotonic() - t0)

    async def start_stallers(self):
        """--stallers identities, each with its own p2pd, connected to the honest peers (at the addresses our
        p2pd has for them)."""
        from tooling.stallers import Stallers

        honest = set(self.honest())
        maddrs = [f"{a}/p2p/{p.peer_id.to_base58()}" for p in await self.node.dht.p2p.list_peers()
                  if p.peer_id.to_base58() in honest for a in p.addrs[:1]]
        return await Stallers(self.args.stallers, size=STALLER_BYTES).start(maddrs)

    def start_sybils(self) -> None:
        from swarm_node.swarm import PeerInfo, SwarmPeer

        while len(self.sybils) < self.args.sybils:
            info = PeerInfo(mode="grpo", model_name="sybil", tokenizer_fp=self.info.tokenizer_fp,
                            task_id=self.info.task_id)
            self.sybils.append(SwarmPeer(self.cfg, info, validate=None).start())  # they only publish

    def settled(self, mode: str) -> bool:
        """Has the honest node cut off what this mode holds open? stall_announce's stallers hold every stream
        they are asked on until the requester hangs up (its stall cut-off): ending the mode before then would
        close them, and the honest node would count those downloads `stream_error` instead."""
        if mode == "stall_announce":
            return self.stallers is not None and bool(self.stallers.hung_up)
        return True

    def end_mode(self, mode: str) -> None:
        if mode == "sybil":
            self._sybil_round = 0
        if mode == "stall_announce" and self.stallers is not None:
            log.info("stall_announce ends: %d requests held, %d cut off by the requester after %s s", self.stallers.requests,
                     len(self.stallers.hung_up), [round(s, 1) for s in self.stallers.hung_up[:8]])
            self.run_on_loop(self.stallers.close(), timeout=60)
            self.stallers = None
        for w in getattr(self, "_held", []):
            try:
                w.close()
            except Exception:
                pass
        self._held = []
        if mode == "sybil":
            for s in self.sybils:
                s.close()
            self.sybils = []

    def run(self) -> None:
        modes = self.args.modes.split(",") if self.args.modes else list(MODES)
        end = time.monotonic() + self.args.wait_s
        while not self.honest() and time.monotonic() < end:
            time.sleep(0.5)
        for mode in modes:
            try:
                self.prepare(mode)
            except Exception as exc:
                log.warning("mode %s: preparing failed: %r", mode, exc)
                self.report.setdefault("errors", []).append(f"{mode}: {exc!r}")
            t0 = time.time()
            done, last, first = 0, -1, None
            give_up = time.monotonic() + self.args.mode_timeout_s
            while ((done < max(self.args.rounds_per_mode, MIN_ROUNDS.get(mode, 1))
                    or time.monotonic() - (first or time.monotonic()) < max(MIN_SECONDS.get(mode, 0.0),
                                                                            self.args.min_mode_s)
                    or not self.settled(mode))
                   and time.monotonic() < give_up):
                r = self.honest_round()
                if r > last:
                    try:
                        ok = self.act(mode, r + 1)
                    except Exception as exc:  # an attack that fails to launch is reported, not fatal
                        log.warning("mode %s round %d: %r", mode, r + 1, exc)
                        self.report.setdefault("errors", []).append(f"{mode}: {exc!r}")
                        ok = True
                    if ok:
                        last, done = r, done + 1
                        first = first or time.monotonic()
                time.sleep(0.2)
            end = time.monotonic() + 10
            while self.honest_round() <= last + 2 and time.monotonic() < end:  # let the honest node take the last
                time.sleep(0.2)
            self.end_mode(mode)
            self.report["modes"][mode] = [t0, time.time()]
            self.save()
            time.sleep(self.args.gap_s)
        self.report["done"] = time.time()
        self.save()

    def close(self) -> None:
        self.end_mode("sybil")
        self.end_mode("stall_announce")
        self.node.close()


# ---- honest nodes beside the adversary, and the same seeded run without it (tests and benchmarks/attack.py) ----


def honest_overrides(swarm_id: str, seed: int) -> dict:
    """A tiny-s GRPO node that keeps a round to a second or two on 2 cores; oversize = over 1 MiB."""
    return {"seed": seed, "rounds": None, "task.prompts_per_round": 4, "task.eval_n": 50, "metrics.eval_every": 4,
            "checkpoint.every_rounds": 1000, "swarm.swarm_id": swarm_id, "swarm.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
            "swarm.heartbeat_s": 1.0, "swarm.record_ttl_s": 8.0, "swarm.collect_deadline_s": 8.0,
            "swarm.bootstrap_timeout_s": 20.0, "swarm.max_batch_bytes": 1 << 20}


def attribute(rows: list[dict], report: dict, slack_s: float = 1.0) -> dict[str, dict[str, int]]:
    """Rejections (and `rewards_overridden`) of the honest node's rows, per adversary mode, by time window."""
    out: dict[str, dict[str, int]] = {}
    for mode, (t0, t1) in report.get("modes", {}).items():
        c: dict[str, int] = {}
        for r in rows:
            if "time" in r and t0 <= r["time"] <= t1 + slack_s:
                for k, v in (r.get("rejected") or {}).items():
                    c[k] = c.get(k, 0) + v
                if r.get("rewards_overridden"):
                    c["rewards_overridden"] = c.get("rewards_overridden", 0) + r["rewards_overridden"]
        out[mode] = c
    return out


def counted(mode: str, reasons: dict[str, int]) -> bool:
    """Did the honest node count what MODES says `mode` must cause? (a reason ending in ':' is a prefix)"""
    want = MODES[mode]
    return all(any(k == w or (w.endswith(":") and k.startswith(w)) for k in reasons if reasons[k] > 0) for w in want)


def params_finite(state_dir: Path) -> bool:
    """Every tensor of every checkpoint the node wrote is finite (and there is at least one)."""
    import torch
    from safetensors.torch import load_file

    files = list(Path(state_dir).rglob("*.safetensors"))
    return bool(files) and all(bool(torch.isfinite(t.float()).all()) for f in files for t in load_file(f).values())


def run_side_by_side(tmp: Path, presets: Path, *, modes: list[str], rounds_per_mode: int = 1, seed: int = 1,
                     timeout_s: float = 600.0, template: Path | None = None, overrides: dict | None = None) -> dict:
    """Two swarms at once on 127.0.0.1, each a bootstrap and one honest tiny-s node with the same seed (and
    `overrides` on top of honest_overrides); the second also has the adversary running `modes`. Both nodes
    are stopped (SIGTERM: checkpoint, exit 0) when the adversary is done. Returns both nodes' metrics rows,
    exit codes, the adversary's report, and the wall time both ran."""
    import subprocess

    from swarm_node.node.metrics import read_metrics
    from swarm_node.runs.local_swarm import (
        Peer,
        child_env,
        start_bootstrap,
        stop_process,
        stop_processes,
        write_peer_config,
    )

    template = template or Path(__file__).resolve().parents[1] / "peers" / "tiny-s.yaml"
    boots, peers = [], []
    adv = None
    out = tmp / "adversary.json"
    try:
        for name in ("baseline", "attacked"):
            swarm_id = f"attack-{name}"
            boot = start_bootstrap(tmp / f"boot-{name}", swarm_id)
            boots.append(boot)
            cfg = write_peer_config(template, tmp / "configs" / f"{name}.yaml",
                                    honest_overrides(swarm_id, seed) | (overrides or {}))
            peers.append(Peer(name=name, config=cfg, state_dir=tmp / name))
        t0 = time.monotonic()
        for p, b in zip(peers, boots, strict=True):
            p.start(b.maddrs)
        adv_log = open(tmp / "adversary.log", "w")
        adv = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--model-dir", str(presets / "tiny-s"), "--maddr",
             boots[1].maddrs[0], "--swarm-id", "attack-attacked", "--out", str(out), "--state-dir",
             str(tmp / "adversary-state"), "--modes", ",".join(modes), "--rounds-per-mode", str(rounds_per_mode)],
            stdout=adv_log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and adv.poll() is None and all(p.running() for p in peers):
            time.sleep(1.0)
        wall = time.monotonic() - t0
        codes = dict(zip([p.name for p in peers], stop_processes([p.proc for p in peers], grace_s=60), strict=True))
        report = json.loads(out.read_text()) if out.exists() else {}
        rows = {p.name: read_metrics(p.metrics) if p.metrics.exists() else [] for p in peers}
        logs = {p.name: p.log_path.read_text()[-4000:] if p.log_path and p.log_path.exists() else "" for p in peers}
        logs["adversary"] = (tmp / "adversary.log").read_text()[-4000:]
        return {"rows": rows, "codes": codes, "report": report, "wall_s": wall, "logs": logs,
                "adversary_done": "done" in report, "state_dirs": {p.name: p.state_dir for p in peers}}
    finally:
        if adv is not None:
            stop_process(adv, grace_s=20)
        for p in peers:
            if p.proc is not None and p.running():
                stop_process(p.proc, grace_s=15)
        for b in boots:
            b.stop()


def _rate(rows: list[dict]) -> float:
    """Rounds per second from round 1 to the last round."""
    if len(rows) < 3:
        return 0.0
    return (len(rows) - 2) / max(1e-9, rows[-1]["time"] - rows[1]["time"])


def _first_round_s(rows: list[dict]) -> float | None:
    return round(rows[1]["time"] - rows[0]["time"], 2) if len(rows) > 1 else None


def round_seconds(rows: list[dict], t0: float, t1: float) -> dict:
    """Median seconds of the rounds that ended in [t0, t1], and of their training step and exchange."""
    spans = [(b["time"] - a["time"], b) for a, b in zip(rows, rows[1:], strict=False) if t0 <= b.get("time", 0) <= t1]

    def med(xs):
        return round(float(np.median(xs)), 4) if xs else None

    def took(b):  # a round that trained on the adversary's groups, or refused some by a cap
        return any("adversary" in k for k in (b.get("external_groups_by_peer") or {})) or any(
            (b.get("rejected") or {}).get(k) for k in ("token_capped", "share_capped"))

    hit = [(d, b) for d, b in spans if took(b)]
    return {"rounds": len(spans), "round_s": med([d for d, _ in spans]),
            "mean_round_s": round(float(np.mean([d for d, _ in spans])), 4) if spans else None,
            "train_s": med([b.get("train_s") or 0.0 for _, b in spans]),
            "exchange_s": med([(b.get("time_split_s") or {}).get("exchange", 0.0) for _, b in spans]),
            "took_rounds": len(hit), "took_round_s": med([d for d, _ in hit]),
            "took_train_s": med([b.get("train_s") or 0.0 for _, b in hit]),
            "took_exchange_s": med([(b.get("time_split_s") or {}).get("exchange", 0.0) for _, b in hit])}


def summarize(run: dict) -> dict:
    """Per mode: reasons counted; overall: rounds (attacked / baseline), params finite, accuracy curves."""
    base, att = run["rows"]["baseline"], run["rows"]["attacked"]
    by_mode = attribute(att, run["report"])
    acc = {name: {r["round"]: r["eval_accuracy"] for r in rows if r.get("eval_accuracy") is not None}
           for name, rows in run["rows"].items()}
    common = sorted(set(acc["baseline"]) & set(acc["attacked"]))
    deltas = [acc["attacked"][k] - acc["baseline"][k] for k in common]
    return {
        "modes": {m: {"reasons": by_mode.get(m, {}), "counted": counted(m, by_mode.get(m, {})),
                      "timing": {n: round_seconds(run["rows"][n], t0, t1) for n in ("baseline", "attacked")}}
                  for m, (t0, t1) in run["report"].get("modes", {}).items()},
        "rounds": {"baseline": len(base) - 1, "attacked": len(att) - 1},
        # rounds per second after round 1: the first exchange waits (up to collect_deadline_s) once for the
        # live peers' first batches, and an adversary that is live but has not published costs that wait
        "pace_ratio": _rate(att) / _rate(base) if _rate(base) > 0 else float("nan"),
        "first_round_s": {"baseline": _first_round_s(base), "attacked": _first_round_s(att)},
        "params_finite": {n: params_finite(d) for n, d in run["state_dirs"].items()},
        "acc_rounds": common, "acc_delta": deltas,
        "max_abs_acc_delta": max((abs(d) for d in deltas), default=float("nan")),
        "loss_finite": all(r["loss"] is None or np.isfinite(r["loss"]) for r in att),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--maddr", required=True)
    ap.add_argument("--swarm-id", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--modes", default="", help="comma-separated; default: every mode")
    ap.add_argument("--rounds-per-mode", type=int, default=2)
    ap.add_argument("--gap-s", type=float, default=1.0)
    ap.add_argument("--mode-timeout-s", type=float, default=30.0)
    ap.add_argument("--min-mode-s", type=float, default=0.0, help="run each mode at least this long after its first act")
    ap.add_argument("--wait-s", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--sybils", type=int, default=3)
    ap.add_argument("--stallers", type=int, default=64, help="stall_announce: identities that announce and never deliver")
    ap.add_argument("--oversize-bytes", type=int, default=2 << 20)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    adv = Adversary(args)
    try:
        adv.run()
    except KeyboardInterrupt:
        pass
    finally:
        adv.close()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
